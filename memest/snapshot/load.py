"""Read a snapshot file in any supported format; the only place that detects formats.

Formats: memest JSON (``format: memest.allocator_snapshot``), torch's pickle from
``_dump_snapshot`` (read with the restricted unpickler), torch's dict saved as JSON; each may be
gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memest.errors import SnapshotFormatError
from memest.files import (
    STREAM_CHUNK_BYTES,
    gunzip_chunks,
    max_input_bytes,
    open_regular_file,
    read_chunks,
)
from memest.snapshot._unpickle import safe_load
from memest.snapshot.convert import from_torch
from memest.snapshot.format import FORMAT_NAME, Snapshot, compact_events, validate
from memest.snapshot.stream import read_json


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
    view = memoryview(data)
    chunks = (
        bytes(view[i : i + STREAM_CHUNK_BYTES]) for i in range(0, len(view), STREAM_CHUNK_BYTES)
    )
    return _parse_chunks(
        chunks,
        source=source,
        scrub_paths=scrub_paths,
        limit=max_input_bytes() if limit is None else limit,
    )


def _parse_chunks(
    chunks: Iterator[bytes], *, source: str, scrub_paths: bool, limit: int
) -> Snapshot:
    """The one reader: gzip inflated and JSON decoded as the chunks arrive, so neither the
    compressed nor the decompressed text is ever held whole; a pickle is read whole (the
    unpickler needs it) and dropped before its conversion."""
    head, chunks = _head(chunks)
    if not head:
        raise SnapshotFormatError(f"{source}: empty file")
    kind = _detect(head, source)
    while kind == "gzip":  # refuses a bomb of junk after its first inflated piece
        chunks = gunzip_chunks(chunks, limit=limit, source=source, error=SnapshotFormatError)
        head, chunks = _head(chunks)
        if not head:
            raise SnapshotFormatError(f"{source}: empty file")
        kind = _detect(head, source)
    if kind == "json":
        obj = read_json(chunks, source=source)  # torch's dict as JSON converts to lists
        return compact_events(to_memest(obj, source=source, scrub_paths=scrub_paths))
    stream = _ChunkStream(chunks)
    obj = safe_load(io.BufferedReader(stream), source=source)
    _check_torch_size(obj, stream.n_bytes, source)
    snap = to_memest(obj, source=source, scrub_paths=scrub_paths)
    del obj  # torch's form, many times the converted one
    return compact_events(snap)


class _ChunkStream(io.RawIOBase):
    """The chunks as a binary file, for the unpickler; counts the bytes read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.rest = memoryview(b"")
        self.n_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.rest:
            piece = next(self.chunks, None)
            if piece is None:
                return 0
            self.rest = memoryview(piece)
        n = min(len(buffer), len(self.rest))
        buffer[:n] = self.rest[:n]
        self.rest = self.rest[n:]
        self.n_bytes += n
        return n


def _head(chunks: Iterator[bytes], n_bytes: int = 1024) -> tuple[bytes, Iterator[bytes]]:
    """The first ``n_bytes`` (fewer when the content is shorter), and all the chunks again."""
    taken: list[bytes] = []
    size = 0
    for piece in chunks:
        taken.append(piece)
        size += len(piece)
        if size >= n_bytes:
            break
    head = b"".join(taken)[:n_bytes]
    return head, itertools.chain(taken, chunks)


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
    with open_regular_file(p, error=SnapshotFormatError) as handle:
        chunks = read_chunks(handle, limit=limit, source=str(p), error=SnapshotFormatError)
        return _parse_chunks(chunks, source=str(p), scrub_paths=scrub_paths, limit=limit)


def dump_snapshot(snapshot: Snapshot, path: str | Path) -> None:
    """Write a memest snapshot as compact JSON (gzip when the name ends in .gz)."""
    text = json.dumps(snapshot, separators=(",", ":"), default=_plain)
    p = Path(path)
    if p.suffix == ".gz":
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)


def _plain(value: object) -> list[int]:
    """Compact event columns (array) as JSON lists."""
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
