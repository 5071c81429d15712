"""Read a snapshot file in any supported format; the only place that detects formats.

Formats: memest JSON (``format: memest.allocator_snapshot``), torch's pickle from
``_dump_snapshot`` (read with the restricted unpickler), torch's dict saved as JSON; each may be
gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from memest.errors import SnapshotFormatError
from memest.snapshot._unpickle import safe_loads
from memest.snapshot.convert import from_torch
from memest.snapshot.format import FORMAT_NAME, Snapshot, validate


def detect_format(data: bytes) -> str:
    """Return ``"gzip"``, ``"pickle"``, ``"json"`` or raise for anything else."""
    if data[:2] == b"\x1f\x8b":
        return "gzip"
    if data[:1] == b"\x80" or data[:1] in (b"(", b"}", b"]", b"c"):
        return "pickle"  # protocol 2+ starts with PROTO; 0 and 1 with MARK / EMPTY_* / GLOBAL
    if data.lstrip()[:1] in (b"{", b"["):
        return "json"
    raise SnapshotFormatError(
        "unknown snapshot format: expected memest JSON, a torch snapshot pickle or gzip of either"
    )


def parse_snapshot(data: bytes, *, source: str = "snapshot", scrub_paths: bool = False) -> Snapshot:
    """Parse snapshot bytes into memest's form (converting torch's form if needed).

    Raises:
        SnapshotFormatError: empty, truncated, unsafe, or unknown content; names the problem.
    """
    if not data:
        raise SnapshotFormatError(f"{source}: empty file")
    kind = detect_format(data)
    if kind == "gzip":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise SnapshotFormatError(f"{source}: truncated or corrupt gzip ({exc})") from None
        return parse_snapshot(data, source=source, scrub_paths=scrub_paths)
    obj: Any
    if kind == "pickle":
        obj = safe_loads(data, source=source)
    else:
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as exc:
            raise SnapshotFormatError(
                f"{source}: invalid or truncated JSON at line {exc.lineno} column {exc.colno}"
            ) from None
        except UnicodeDecodeError:
            raise SnapshotFormatError(f"{source}: not UTF-8 JSON") from None
    return to_memest(obj, source=source, scrub_paths=scrub_paths)


def to_memest(obj: object, *, source: str = "snapshot", scrub_paths: bool = False) -> Snapshot:
    """Accept memest's form (validated) or torch's dict (converted)."""
    if isinstance(obj, dict) and "format" in obj:
        if obj.get("format") != FORMAT_NAME:
            raise SnapshotFormatError(f"{source}: unknown snapshot format {obj.get('format')!r}")
        return validate(obj, source=source)
    if isinstance(obj, dict) and ("device_traces" in obj or "segments" in obj):
        return validate(from_torch(obj, scrub_paths=scrub_paths, source=source), source=source)
    raise SnapshotFormatError(
        f"{source}: neither a memest snapshot (no 'format' key) nor a torch snapshot "
        "(no 'segments' / 'device_traces')"
    )


def load_snapshot(path: str | Path, *, scrub_paths: bool = False) -> Snapshot:
    """Read and validate a snapshot file.

    Raises:
        SnapshotFormatError: see parse_snapshot.
        OSError: the file cannot be read.
    """
    p = Path(path)
    return parse_snapshot(p.read_bytes(), source=str(p), scrub_paths=scrub_paths)


def dump_snapshot(snapshot: Snapshot, path: str | Path) -> None:
    """Write a memest snapshot as compact JSON (gzip when the name ends in .gz)."""
    text = json.dumps(snapshot, separators=(",", ":"))
    p = Path(path)
    if p.suffix == ".gz":
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
