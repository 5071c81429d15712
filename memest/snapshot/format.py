"""memest's JSON form of an allocator snapshot, and its validation.

Torch's snapshot repeats a full Python stack on every event (several KB each). memest's form keeps
the same facts in columns, with frames, stacks, tags and actions interned once::

    {
      "format": "memest.allocator_snapshot", "version": 1,
      "source": {"torch_version": "2.11.0", "device": 0, "max_entries": 1000000, "scrubbed": true},
      "frames":  [[filename, line, name], ...],
      "stacks":  [[frame index, innermost first], ...],
      "tags":    ["", "memest/1;phase=capture;stage=target.full;pool=0,1", ...],
      "actions": ["alloc", "free_requested", ...],
      "events":  {"action": [...], "addr": [...], "size": [...], "stream": [...],
                  "time_us": [...], "tag": [...], "stack": [...], "pool": [...]},
      "segments": [{"address", "total_size", "pool", "stream", "segment_type", "is_expandable",
                    "blocks": [{"address", "size", "requested_size", "state", "stack"}]}],
      "windows": [{"kind": "phase" | "stage" | "capture", "tag", "start_us", "end_us",
                   "window", "pool"}],
      "phases":  [PhaseRecord as JSON, ...]
    }

Windows are the recorder's own record of each phase, stage and CUDA-graph capture (with the pool
learnt at capture end); the analysis counts graphs from them and, when events carry no tag,
assigns events to the innermost window by time. ``events.stack`` is -1 for an event without
frames; ``events.pool`` is optional (torch 2.11 records no pool per event) and holds an index
into ``pools`` or -1.
"""

from __future__ import annotations

from array import array
from typing import Any

from pydantic import ValidationError

from memest.errors import SnapshotFormatError, first_error
from memest.schema.breakdown import PhaseRecord
from memest.snapshot.stream import compact_column
from memest.units import MAX_BYTES

FORMAT_NAME = "memest.allocator_snapshot"
FORMAT_VERSION = 1

EVENT_COLUMNS = ("action", "addr", "size", "stream", "time_us", "tag", "stack")
_ADDRESS_MAX = 2**64 - 1
_INT64_MIN = -(2**63)
# Value range of each event column: sizes and addresses are byte counts, the rest ids or times.
_COLUMN_RANGES = {
    "action": (0, MAX_BYTES),
    "addr": (0, _ADDRESS_MAX),
    "size": (0, MAX_BYTES),
    "stream": (_INT64_MIN, _ADDRESS_MAX),
    "time_us": (_INT64_MIN, MAX_BYTES),
    "tag": (0, MAX_BYTES),
    "stack": (-1, MAX_BYTES),
    "pool": (-1, MAX_BYTES),
}
SEGMENT_KEYS = ("address", "total_size", "pool", "blocks")

Snapshot = dict[str, Any]
"""A memest snapshot (JSON object). Validated by :func:`validate`."""


def empty_snapshot() -> Snapshot:
    """A valid snapshot with no events and no segments."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "source": {},
        "frames": [],
        "stacks": [],
        "tags": [""],
        "actions": [],
        "events": {name: [] for name in EVENT_COLUMNS},
        "segments": [],
        "windows": [],
        "phases": [],
    }


def compact_events(snapshot: Snapshot) -> Snapshot:
    """The same snapshot with its event columns in compact arrays (validated lists first: a
    column of non-integers is left for validate to name)."""
    events = snapshot.get("events")
    if isinstance(events, dict):
        for name, column in events.items():
            if isinstance(column, list) and all(type(v) is int for v in column):
                events[name] = compact_column(column)
    return snapshot


def _require(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise SnapshotFormatError(f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise SnapshotFormatError(f"{where}.{key}: expected {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def validate(snapshot: object, *, source: str = "snapshot") -> Snapshot:
    """Check a memest snapshot's shape and values: lengths, index ranges, integer columns.

    Returns:
        The same object, typed.

    Raises:
        SnapshotFormatError: wrong format name, unknown version, a missing key, columns of
            different lengths, an index out of range, a non-integer, negative or impossible size;
            the message names the key.
    """
    snapshot = _check_header(snapshot, source)
    frames = _require(snapshot, "frames", list, source)
    stacks = _require(snapshot, "stacks", list, source)
    tags = _require(snapshot, "tags", list, source)
    actions = _require(snapshot, "actions", list, source)
    events = _require(snapshot, "events", dict, source)
    _require(snapshot, "segments", list, source)
    _check_events(snapshot, events, {"action": actions, "tag": tags, "stack": stacks}, source)
    _check_stacks(stacks, frames, source)
    for i, seg in enumerate(snapshot["segments"]):
        _check_segment(seg, f"{source}.segments[{i}]")
    for key in ("windows", "phases"):
        if key in snapshot and not isinstance(snapshot[key], list):
            raise SnapshotFormatError(f"{source}.{key}: expected a list")
    _check_windows(snapshot.get("windows", []), source)
    _check_phases(snapshot.get("phases", []), source)
    return snapshot


def _check_header(snapshot: object, source: str) -> dict[str, Any]:
    """A JSON object of this format and version."""
    if not isinstance(snapshot, dict):
        raise SnapshotFormatError(f"{source}: expected a JSON object")
    fmt = snapshot.get("format")
    if fmt != FORMAT_NAME:
        raise SnapshotFormatError(f"{source}: format is {_short(fmt)}, expected {FORMAT_NAME!r}")
    version = snapshot.get("version")
    if version != FORMAT_VERSION:
        raise SnapshotFormatError(
            f"{source}: unknown snapshot version {_short(version)} (this memest reads version "
            f"{FORMAT_VERSION})"
        )
    return snapshot


def _check_events(
    snapshot: dict[str, Any], events: dict[str, Any], tables: dict[str, list[Any]], source: str
) -> None:
    """The event columns: equal lengths, integers in range, indexes inside their tables
    (``tables``: the action, tag and stack tables; pools when a pool column is present)."""
    columns = {name: _column(events, name, source) for name in EVENT_COLUMNS}
    n = len(columns["action"])
    optional = ("pool",) if "pool" in events else ()
    for name in (*EVENT_COLUMNS, *optional):
        _check_column(events[name], name, n, source)
    if optional:
        pools = _require(snapshot, "pools", list, source)
        if n and max(events["pool"]) >= len(pools):
            raise SnapshotFormatError(f"{source}.events.pool: index outside the pools table")
    for name in ("action", "tag"):
        table = tables[name]
        if n and max(columns[name]) >= len(table):
            raise SnapshotFormatError(f"{source}.events.{name}: index outside the {name}s table")
        _check_strings(table, f"{source}.{name}s")
    pools = snapshot.get("pools", [])
    if not isinstance(pools, list):
        raise SnapshotFormatError(f"{source}.pools: expected a list")
    _check_strings(pools, f"{source}.pools")
    if n and max(columns["stack"]) >= len(tables["stack"]):
        raise SnapshotFormatError(f"{source}.events.stack: index outside the stacks table")


def _column(events: dict[str, Any], name: str, source: str) -> Any:
    column = events.get(name)
    return column if isinstance(column, array) else _require(events, name, list, f"{source}.events")


def _check_stacks(stacks: list[Any], frames: list[Any], source: str) -> None:
    """Each stack lists frame indexes; each frame is [filename, line, name]."""
    n_frames = len(frames)
    for i, stack in enumerate(stacks):
        if not isinstance(stack, list) or any(
            type(f) is not int or f < 0 or f >= n_frames for f in stack
        ):
            raise SnapshotFormatError(f"{source}.stacks[{i}]: frame index outside the frames table")
    for i, frame in enumerate(frames):
        if not isinstance(frame, list) or len(frame) != 3 or type(frame[1]) is not int:
            raise SnapshotFormatError(f"{source}.frames[{i}]: expected [filename, line, name]")


def _check_column(column: list[Any], name: str, n: int, source: str) -> None:
    """Same length as 'action', integers only, within the column's range."""
    where = f"{source}.events.{name}"
    if len(column) != n:
        raise SnapshotFormatError(f"{where}: {len(column)} values, expected {n} (as 'action')")
    if not n:
        return
    # array columns (the stream reader's) hold integers by construction
    if not isinstance(column, array) and set(map(type, column)) != {int}:
        raise SnapshotFormatError(f"{where}: expected integers only")
    low, high = _COLUMN_RANGES[name]
    if min(column) < low or max(column) > high:
        raise SnapshotFormatError(f"{where}: value outside {low}..{high}")


def _check_strings(table: list[Any], where: str) -> None:
    if any(not isinstance(v, str) for v in table):
        raise SnapshotFormatError(f"{where}: expected strings only")


def _check_size(value: object, where: str) -> None:
    if type(value) is not int or not 0 <= value <= _ADDRESS_MAX:
        raise SnapshotFormatError(f"{where}: expected a byte count, got {_short(value)}")


def _short(value: object) -> str:
    text = (
        repr(value) if not isinstance(value, int) or value.bit_length() < 80 else "a huge integer"
    )
    return text if len(text) <= 40 else text[:37] + "..."


def _check_segment(seg: object, where: str) -> None:
    if not isinstance(seg, dict):
        raise SnapshotFormatError(f"{where}: expected an object")
    for key in SEGMENT_KEYS:
        if key not in seg:
            raise SnapshotFormatError(f"{where}: missing key {key!r}")
    _check_pool(seg["pool"], f"{where}.pool")
    _check_size(seg["address"], f"{where}.address")
    _check_size(seg["total_size"], f"{where}.total_size")
    if not isinstance(seg["blocks"], list):
        raise SnapshotFormatError(f"{where}.blocks: expected a list")
    for j, block in enumerate(seg["blocks"]):
        if not isinstance(block, dict):
            raise SnapshotFormatError(f"{where}.blocks[{j}]: expected an object")
        for key in ("address", "size", "requested_size"):
            if key in block:
                _check_size(block[key], f"{where}.blocks[{j}].{key}")
        if not isinstance(block.get("state", ""), str):
            raise SnapshotFormatError(f"{where}.blocks[{j}].state: expected a string")


def _check_pool(pool: object, where: str) -> None:
    """A pool id: ``"0,1"`` or a pair of integers, as torch writes it."""
    if isinstance(pool, str):
        return
    if isinstance(pool, list | tuple) and all(type(p) is int for p in pool):
        return
    raise SnapshotFormatError(f'{where}: expected a pool id such as "0,1"')


def _check_windows(windows: list[Any], source: str) -> None:
    for i, window in enumerate(windows):
        if not isinstance(window, dict):
            raise SnapshotFormatError(f"{source}.windows[{i}]: expected an object")
        for key in ("start_us", "end_us", "window"):
            value = window.get(key)
            if value is not None and (type(value) is not int or abs(value) > MAX_BYTES):
                raise SnapshotFormatError(f"{source}.windows[{i}].{key}: expected an integer")


def _check_phases(phases: list[Any], source: str) -> None:
    for i, phase in enumerate(phases):
        try:
            PhaseRecord.model_validate(phase)
        except ValidationError as exc:
            loc, message, _ = first_error(exc)
            raise SnapshotFormatError(f"{source}.phases[{i}].{loc}: {message}") from None
