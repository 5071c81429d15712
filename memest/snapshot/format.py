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

from typing import Any

from memest.errors import SnapshotFormatError

FORMAT_NAME = "memest.allocator_snapshot"
FORMAT_VERSION = 1

EVENT_COLUMNS = ("action", "addr", "size", "stream", "time_us", "tag", "stack")
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
    """Check a memest snapshot's shape (cheap: lengths and index ranges, not every value type).

    Returns:
        The same object, typed.

    Raises:
        SnapshotFormatError: wrong format name, unknown version, a missing key, columns of
            different lengths, or an index out of range; the message names the key.
    """
    if not isinstance(snapshot, dict):
        raise SnapshotFormatError(f"{source}: expected a JSON object")
    fmt = snapshot.get("format")
    if fmt != FORMAT_NAME:
        raise SnapshotFormatError(f"{source}: format is {fmt!r}, expected {FORMAT_NAME!r}")
    version = snapshot.get("version")
    if version != FORMAT_VERSION:
        raise SnapshotFormatError(
            f"{source}: unknown snapshot version {version!r} (this memest reads version "
            f"{FORMAT_VERSION})"
        )
    frames = _require(snapshot, "frames", list, source)
    stacks = _require(snapshot, "stacks", list, source)
    tags = _require(snapshot, "tags", list, source)
    actions = _require(snapshot, "actions", list, source)
    events = _require(snapshot, "events", dict, source)
    _require(snapshot, "segments", list, source)
    columns = {name: _require(events, name, list, f"{source}.events") for name in EVENT_COLUMNS}
    n = len(columns["action"])
    optional = ("pool",) if "pool" in events else ()
    for name in (*EVENT_COLUMNS, *optional):
        if len(events[name]) != n:
            raise SnapshotFormatError(
                f"{source}.events.{name}: {len(events[name])} values, expected {n} (as 'action')"
            )
    if optional:
        _require(snapshot, "pools", list, source)
    for name, table in (("action", actions), ("tag", tags)):
        col = columns[name]
        if n and (min(col) < 0 or max(col) >= len(table)):
            raise SnapshotFormatError(f"{source}.events.{name}: index outside the {name}s table")
    stack_col = columns["stack"]
    if n and (min(stack_col) < -1 or max(stack_col) >= len(stacks)):
        raise SnapshotFormatError(f"{source}.events.stack: index outside the stacks table")
    n_frames = len(frames)
    for i, stack in enumerate(stacks):
        if not isinstance(stack, list) or any(
            not isinstance(f, int) or f < 0 or f >= n_frames for f in stack
        ):
            raise SnapshotFormatError(f"{source}.stacks[{i}]: frame index outside the frames table")
    for i, frame in enumerate(frames):
        if not isinstance(frame, list) or len(frame) != 3:
            raise SnapshotFormatError(f"{source}.frames[{i}]: expected [filename, line, name]")
    for i, seg in enumerate(snapshot["segments"]):
        if not isinstance(seg, dict):
            raise SnapshotFormatError(f"{source}.segments[{i}]: expected an object")
        for key in SEGMENT_KEYS:
            if key not in seg:
                raise SnapshotFormatError(f"{source}.segments[{i}]: missing key {key!r}")
    for key in ("windows", "phases"):
        if key in snapshot and not isinstance(snapshot[key], list):
            raise SnapshotFormatError(f"{source}.{key}: expected a list")
    return snapshot
