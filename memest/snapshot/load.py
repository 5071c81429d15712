"""Read a snapshot file in any supported format; the only place that detects formats.

Formats: memest JSON (``format: memest.allocator_snapshot``), torch's pickle from
``_dump_snapshot`` (read with the restricted unpickler), torch's dict saved as JSON; each may be
gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memest.errors import SnapshotFormatError
from memest.files import gunzip, gzip_head, max_input_bytes, parse_json, read_regular_file
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


def parse_snapshot(
    data: bytes | bytearray,
    *,
    source: str = "snapshot",
    scrub_paths: bool = False,
    limit: int | None = None,
) -> Snapshot:
    """Parse snapshot bytes into memest's form (converting torch's form if needed).

    ``limit`` caps the decompressed size (default ``MEMEST_MAX_INPUT_BYTES``).

    Raises:
        SnapshotFormatError: empty, truncated, unsafe, oversized or unknown content; names the
            problem.
    """
    if not data:
        raise SnapshotFormatError(f"{source}: empty file")
    kind = _detect(bytes(data[:1024]), source)
    if kind == "gzip":
        _detect(gzip_head(bytes(data)), source)  # refuse a bomb of junk before inflating it
        data = gunzip(
            bytes(data),
            limit=max_input_bytes() if limit is None else limit,
            source=source,
            error=SnapshotFormatError,
        )
        return parse_snapshot(data, source=source, scrub_paths=scrub_paths, limit=limit)
    obj: Any
    if kind == "pickle":
        obj = safe_loads(data, source=source)
        _check_torch_size(obj, len(data), source)
    else:
        obj = parse_json(data, source=source, error=SnapshotFormatError)
    return to_memest(obj, source=source, scrub_paths=scrub_paths)


def _detect(head: bytes, source: str) -> str:
    try:
        return detect_format(head)
    except SnapshotFormatError as exc:
        raise SnapshotFormatError(f"{source}: {exc}") from None


def _check_torch_size(obj: object, n_bytes: int, source: str) -> None:
    """Refuse a pickle whose shared references multiply its entries.

    A pickle can list one object many times at two bytes a reference, so lists of shared lists
    reach billions of entries from a small file; an honest snapshot spends more than a byte on
    every entry and frame, so counting stops (and refuses) past ``n_bytes``.
    """
    count = 0
    for n in _entry_counts(obj):
        count += n
        if count > n_bytes:
            raise SnapshotFormatError(
                f"{source}: pickle repeats shared entries (over {count:,} entries and frames "
                f"from {n_bytes:,} bytes)"
            )


def _entry_counts(obj: object) -> Iterator[int]:
    """One count per trace entry, segment and block: itself plus its frames."""
    if not isinstance(obj, dict):
        return
    for trace in _as_list(obj.get("device_traces")):
        yield 1
        for entry in _as_list(trace):
            yield 1 + _frame_count(entry)
    for seg in _as_list(obj.get("segments")):
        yield 1 + _frame_count(seg)
        for block in _as_list(seg.get("blocks") if isinstance(seg, dict) else None):
            yield 1 + _frame_count(block)


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _frame_count(item: object) -> int:
    return len(_as_list(item.get("frames"))) if isinstance(item, dict) else 0


def to_memest(obj: object, *, source: str = "snapshot", scrub_paths: bool = False) -> Snapshot:
    """Accept memest's form (validated) or torch's dict (converted)."""
    if isinstance(obj, dict) and "format" in obj:
        if obj.get("format") != FORMAT_NAME:
            raise SnapshotFormatError(f"{source}: unknown snapshot format {obj.get('format')!r}")
        return validate(obj, source=source)
    if isinstance(obj, dict) and ("device_traces" in obj or "segments" in obj):
        try:
            converted = from_torch(obj, scrub_paths=scrub_paths, source=source)
        except SnapshotFormatError:
            raise  # already names the field
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            # torch's dict arrives from an untrusted file: any field may have any type
            raise SnapshotFormatError(
                f"{source}: malformed torch snapshot ({type(exc).__name__}: {str(exc)[:80]})"
            ) from None
        return validate(converted, source=source)
    raise SnapshotFormatError(
        f"{source}: neither a memest snapshot (no 'format' key) nor a torch snapshot "
        "(no 'segments' / 'device_traces')"
    )


def load_snapshot(path: str | Path, *, scrub_paths: bool = False) -> Snapshot:
    """Read and validate a snapshot file.

    Raises:
        SnapshotFormatError: see parse_snapshot; also a missing, non-regular or oversized file.
        ConfigError: MEMEST_MAX_INPUT_BYTES is not a size.
    """
    p = Path(path)
    limit = max_input_bytes()
    data = read_regular_file(p, limit=limit, error=SnapshotFormatError)
    return parse_snapshot(data, source=str(p), scrub_paths=scrub_paths, limit=limit)


def dump_snapshot(snapshot: Snapshot, path: str | Path) -> None:
    """Write a memest snapshot as compact JSON (gzip when the name ends in .gz)."""
    text = json.dumps(snapshot, separators=(",", ":"))
    p = Path(path)
    if p.suffix == ".gz":
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
