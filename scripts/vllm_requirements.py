"""Print the installed vLLM's own requirements (no extras), one per line, for ``pip install -r``.

``scripts/test-vllm034.sh`` installs vLLM with ``--no-deps`` into a venv layered over the main
one (which already holds torch and most of vLLM's dependencies), then installs what this prints;
pip leaves every requirement the main venv already satisfies where it is.

Usage: python scripts/vllm_requirements.py [--skip NAME ...]
    --skip NAME: leave out requirement NAME (a pin the package registry does not carry), with
    one line on stderr saying so; the version the main venv holds then stands in for it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirements(skip: set[str]) -> list[str]:
    """vLLM's requirements whose marker holds here and that carry no extra, less ``skip``."""
    out = []
    for line in importlib.metadata.requires("vllm") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in skip:
            print(f"vllm_requirements: skipping {req} (--skip)", file=sys.stderr)
            continue
        out.append(str(req))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    try:
        lines = requirements({canonicalize_name(name) for name in args.skip})
    except importlib.metadata.PackageNotFoundError:
        print("vllm_requirements: vLLM is not installed in this interpreter", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
