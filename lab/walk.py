"""Walk one pre-flight request, one capture plan and one what-if: how often each memest file is
entered, and how often the call stack climbs back up into a file it left.

    python lab/walk.py            # every walk, a table per walk
    python lab/walk.py --json     # the counts as JSON

Only memest's own frames are looked at (a frame of another package or of the standard library
is transparent: a memest frame's caller is the nearest memest frame below it). A call *enters*
a file when its memest caller is in another file. It *climbs back up* when the file it enters
is already on the stack below its caller: a layer calling back into one that called it (a
callback, a property read from below, a stage asking an earlier stage again).

Each walk runs once untraced first (imports, calibration files), then with memest.plan's memos
cleared, traced: a memo hit enters no Python frame and would hide the calls it answers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MEMEST = str(ROOT / "memest") + "/"
REPORT = ROOT / "tests/data/reports/call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"
#: The packages whose files the targets bound (at most 3 entries a file).
WALKED = ("memest/preflight/", "memest/estimate/whatif/", "memest/plan/")


@dataclass
class Walk:
    """Entries per file, climbs per (from file, into file), in one traced call."""

    entries: Counter[str] = field(default_factory=Counter)
    climbs: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def climb_count(self) -> int:
        return sum(self.climbs.values())


def _file(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    return name[len(str(ROOT)) + 1 :] if name.startswith(MEMEST) else None


def trace(call: Callable[[], object]) -> Walk:
    """Run ``call`` under a profile hook and count entries and climbs of memest files."""
    walk = Walk()
    stack: list[tuple[FrameType, str | None]] = []  # every Python frame, its memest file or None

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            here = _file(frame)
            if here is not None:
                below = [f for _, f in stack if f is not None]
                caller = below[-1] if below else None
                if caller != here:
                    walk.entries[here] += 1
                    if here in below:
                        walk.climbs[(caller or "", here)] += 1
            stack.append((frame, here))
        elif event == "return":
            while stack and stack[-1][0] is not frame:
                stack.pop()  # a frame unwound without its own return event
            if stack:
                stack.pop()

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


#: One pre-flight request, one plan (both sizings) and one what-if, as a user asks them.
WALKS: dict[str, list[str]] = {
    "preflight": [
        "preflight",
        f"--model-config={ROOT / 'tests/data/configs/llama8b.json'}",
        "--gpu=h200",
        "--max-num-seqs=128",
        "--max-model-len=4096",
        '--speculative-config={"method": "eagle3", "num_speculative_tokens": 3}',
        f"--draft-model-config={ROOT / 'tests/data/configs/eagle3_8b.json'}",
        "--json",
    ],
    "plan": [
        "plan",
        "--gpu=gb200",
        "--spec-method=dspark",
        "--num-spec-tokens=7",
        "--json",
    ],
    "what-if": [
        "estimate",
        f"--from={REPORT}",
        '--grid={"max_num_seqs": 64}',
        f"--model-config={ROOT / 'tests/data/configs/llama8b.json'}",
        "--json",
    ],
}


def _cli(argv: list[str]) -> Callable[[], object]:
    def call() -> object:
        from memest.cli import main

        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        if code != 0:
            raise SystemExit(f"memest {' '.join(argv)} exited {code}")
        return code

    return call


def run(name: str) -> Walk:
    """One walk: an untraced warm call, memest.plan's memos cleared, the traced call."""
    from memest.plan import clear_caches

    call = _cli(WALKS[name])
    call()
    clear_caches()
    return trace(call)


def _table(name: str, walk: Walk) -> str:
    lines = [f"## {name}: {walk.climb_count} climbs back up"]
    for (src, dst), n in walk.climbs.most_common():
        lines.append(f"  climb {n:3d}  {src} -> {dst}")
    for path, n in sorted(walk.entries.items(), key=lambda kv: (-kv[1], kv[0])):
        mark = "  *" if path.startswith(WALKED) and n > 3 else ""
        lines.append(f"  entered {n:4d}  {path}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    walks = {name: run(name) for name in WALKS}
    if args.json:
        out = {
            name: {
                "climbs": w.climb_count,
                "climb_edges": {f"{a} -> {b}": n for (a, b), n in w.climbs.items()},
                "entries": dict(w.entries),
            }
            for name, w in walks.items()
        }
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print("\n\n".join(_table(name, w) for name, w in walks.items()))
        print(
            "\n(* a file of memest/preflight, memest/estimate/whatif or memest/plan entered > 3x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
