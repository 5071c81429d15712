"""Convert torch's snapshot dict (``torch.cuda.memory._snapshot()``) to memest's JSON form, and back.

Conversion is done once, as soon as the snapshot is taken or read: memest's form interns frames,
stacks and tags, so a 1,000,000-event history fits in a few hundred MB of Python objects.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Sequence
from typing import Any

from memest.errors import SnapshotFormatError
from memest.snapshot.format import EVENT_COLUMNS, FORMAT_NAME, FORMAT_VERSION, Snapshot
from memest.snapshot.tags import pool_key

_PKG_DIRS = ("site-packages", "dist-packages")
_FRAME_KEY = operator.itemgetter("filename", "line", "name")


def scrub_path(path: str, roots: Sequence[str] = ()) -> str:
    """Drop local directories from a source path, keeping the part that names the module.

    ``/home/me/.venv/lib/python3.11/site-packages/vllm/x.py`` becomes ``vllm/x.py``; a path
    under one of ``roots`` (e.g. sys.path entries) becomes relative to the longest such root;
    any other absolute path keeps its last two components.
    """
    if not path or path.startswith("<"):
        return path
    norm = path.replace("\\", "/")
    for marker in _PKG_DIRS:
        idx = norm.rfind("/" + marker + "/")
        if idx >= 0:
            return norm[idx + len(marker) + 2 :]
    best = ""
    for root in roots:
        r = root.replace("\\", "/").rstrip("/")
        if r and norm.startswith(r + "/") and len(r) > len(best):
            best = r
    if best:
        return norm[len(best) + 1 :]
    if norm.startswith("/") or (len(norm) > 2 and norm[1] == ":"):
        parts = [p for p in norm.split("/") if p]
        return "/".join(parts[-2:])
    return norm


class _Interner:
    def __init__(self, scrub: bool, roots: Sequence[str]) -> None:
        self.scrub = scrub
        self.roots = list(roots)
        self.frames: list[list[Any]] = []
        self.frame_ids: dict[tuple[str, int, str], int] = {}
        self.stacks: list[list[int]] = []
        self.stack_ids: dict[tuple[int, ...], int] = {}
        self.raw_stack_ids: dict[tuple[tuple[Any, ...], ...], int] = {}
        self.tags: list[str] = [""]
        self.tag_ids: dict[str, int] = {"": 0}
        self.actions: list[str] = []
        self.action_ids: dict[str, int] = {}
        self.pools: list[str] = []
        self.pool_ids: dict[str, int] = {}
        self.path_cache: dict[str, str] = {}

    def frame(self, f: dict[str, Any]) -> int:
        filename = str(f.get("filename", ""))
        if self.scrub:
            cached = self.path_cache.get(filename)
            if cached is None:
                cached = scrub_path(filename, self.roots)
                self.path_cache[filename] = cached
            filename = cached
        key = (filename, int(f.get("line", 0)), str(f.get("name", "")))
        idx = self.frame_ids.get(key)
        if idx is None:
            idx = len(self.frames)
            self.frame_ids[key] = idx
            self.frames.append([key[0], key[1], key[2]])
        return idx

    def stack(self, frames: Iterable[dict[str, Any]] | None) -> int:
        if not frames:
            return -1
        try:
            raw = tuple(map(_FRAME_KEY, frames))
        except KeyError:  # a frame without the usual keys: take the slow path
            raw = tuple(
                (f.get("filename", ""), f.get("line", 0), f.get("name", "")) for f in frames
            )
        idx = self.raw_stack_ids.get(raw)
        if idx is None:
            key = tuple(self.frame({"filename": r[0], "line": r[1], "name": r[2]}) for r in raw)
            idx = self.stack_ids.get(key)
            if idx is None:
                idx = len(self.stacks)
                self.stack_ids[key] = idx
                self.stacks.append(list(key))
            self.raw_stack_ids[raw] = idx
        return idx

    def intern(self, table: list[str], ids: dict[str, int], value: str) -> int:
        idx = ids.get(value)
        if idx is None:
            idx = len(table)
            ids[value] = idx
            table.append(value)
        return idx


def _pick_device(raw: dict[str, Any], device: int | None) -> int:
    traces = raw.get("device_traces") or []
    if device is not None:
        return device
    if traces:
        return max(range(len(traces)), key=lambda d: len(traces[d] or []))
    devices = [s.get("device", 0) for s in raw.get("segments", []) if isinstance(s, dict)]
    return int(devices[0]) if devices else 0


def from_torch(
    raw: object,
    *,
    device: int | None = None,
    scrub_paths: bool = False,
    roots: Sequence[str] = (),
    source: str = "snapshot",
    extra_source: dict[str, Any] | None = None,
) -> Snapshot:
    """Convert torch's snapshot dict to memest's JSON form.

    Args:
        raw: what ``torch.cuda.memory._snapshot()`` returns (or a pickle of it, already loaded).
        device: which device's trace to keep; default the one with the most events.
        scrub_paths: replace local paths in frames by module-relative ones (see scrub_path).
        roots: extra directories to strip when scrubbing (sys.path entries, a checkout).
        source: name used in error messages.
        extra_source: merged into the ``source`` metadata (torch version, max_entries, ...).

    Raises:
        SnapshotFormatError: a required key is missing or has the wrong type.
    """
    top = _torch_top(raw, source)
    dev = _pick_device(top, device)
    interner = _Interner(scrub_paths, roots)
    traces = top["device_traces"][dev] if dev < len(top["device_traces"]) else []
    events = _events(traces or [], interner, dev, source)
    segments = _segments(top["segments"], interner, dev, source)
    meta: dict[str, Any] = {"device": dev, "scrubbed": scrub_paths}
    if extra_source:
        meta.update(extra_source)
    settings = top.get("allocator_settings")
    out: Snapshot = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "source": meta,
        "frames": interner.frames,
        "stacks": interner.stacks,
        "tags": interner.tags,
        "actions": interner.actions,
        "events": events,
        "segments": segments,
        "windows": [],
        "phases": [],
    }
    if "pool" in events:
        out["pools"] = interner.pools
    if isinstance(settings, dict):
        out["allocator_settings"] = {str(k): v for k, v in settings.items() if _jsonable(v)}
    return out


def _torch_top(raw: object, source: str) -> dict[str, Any]:
    """``raw`` as torch's snapshot dict, with its two lists checked."""
    if not isinstance(raw, dict):
        raise SnapshotFormatError(f"{source}: expected a dict at the top of the torch snapshot")
    for key in ("segments", "device_traces"):
        if key not in raw:
            raise SnapshotFormatError(f"{source}: missing key {key!r} (not a torch snapshot?)")
    if not isinstance(raw["segments"], list) or not isinstance(raw["device_traces"], list):
        raise SnapshotFormatError(f"{source}: 'segments' and 'device_traces' must be lists")
    return raw


def _events(
    traces: Sequence[Any], interner: _Interner, dev: int, source: str
) -> dict[str, list[int]]:
    """One device's trace as event columns (a "pool" column only when some event names one).

    The loop runs once per allocator event (millions in a long history): its appends and
    lookups are bound to locals first, and a value is converted only when it is not an int.
    """
    cols: dict[str, list[int]] = {name: [] for name in EVENT_COLUMNS}
    pool_col: list[int] = []
    any_pool = False
    a_action, a_addr, a_size = cols["action"].append, cols["addr"].append, cols["size"].append
    a_stream, a_time, a_tag = cols["stream"].append, cols["time_us"].append, cols["tag"].append
    a_stack = cols["stack"].append
    action_ids, tag_ids = interner.action_ids, interner.tag_ids
    stack_of = interner.stack
    a_pool = pool_col.append
    for i, entry in enumerate(traces):
        try:
            action = entry["action"]
            addr, size = entry.get("addr", 0), entry.get("size", 0)
            stream, t_us = entry.get("stream", 0), entry.get("time_us", 0)
            user_meta = entry.get("user_metadata") or ""
        except (TypeError, KeyError, AttributeError):
            raise SnapshotFormatError(
                f"{source}: device_traces[{dev}][{i}] is not an event with an 'action'"
            ) from None
        if type(addr) is not int or type(size) is not int or type(t_us) is not int:
            addr, size, t_us = _as_int(addr, size, t_us, where=f"{source}: event {i}")
        a_action(
            action_ids[action]
            if action in action_ids
            else interner.intern(interner.actions, action_ids, str(action))
        )
        a_addr(addr)
        a_size(size)
        a_stream(stream if type(stream) is int else int(stream))
        a_time(t_us)
        a_tag(
            tag_ids[user_meta]
            if user_meta in tag_ids
            else interner.intern(interner.tags, tag_ids, str(user_meta))
        )
        a_stack(stack_of(entry.get("frames")))
        pid = entry.get("pool_id")
        if pid is not None:
            any_pool = True
            a_pool(interner.intern(interner.pools, interner.pool_ids, pool_key(pid)))
        else:
            a_pool(-1)
    events: dict[str, list[int]] = dict(cols)
    if any_pool:
        events["pool"] = pool_col
    return events


def _segments(
    raw_segments: list[Any], interner: _Interner, dev: int, source: str
) -> list[dict[str, Any]]:
    """The device's segments, each with its blocks (stacks interned)."""
    segments: list[dict[str, Any]] = []
    for j, seg in enumerate(raw_segments):
        if not isinstance(seg, dict):
            raise SnapshotFormatError(f"{source}: segments[{j}] is not a dict")
        if int(seg.get("device", dev)) != dev:
            continue
        for key in ("address", "total_size"):
            if key not in seg:
                raise SnapshotFormatError(f"{source}: segments[{j}] missing key {key!r}")
        blocks = [
            {
                "address": int(b.get("address", 0)),
                "size": int(b.get("size", 0)),
                "requested_size": int(b.get("requested_size", b.get("size", 0))),
                "state": str(b.get("state", "")),
                "stack": interner.stack(b.get("frames")),
            }
            for b in seg.get("blocks", [])
        ]
        segments.append(
            {
                "address": int(seg["address"]),
                "total_size": int(seg["total_size"]),
                "pool": pool_key(seg.get("segment_pool_id", (0, 0))),
                "stream": int(seg.get("stream", 0)),
                "segment_type": str(seg.get("segment_type", "")),
                "is_expandable": bool(seg.get("is_expandable", False)),
                "allocated_size": int(seg.get("allocated_size", 0)),
                "blocks": blocks,
            }
        )
    return segments


def _as_int(*values: object, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in values)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise SnapshotFormatError(f"{where}: addr / size / time_us must be integers") from None


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _pool_tuple(text: str) -> tuple[int, int]:
    a, _, b = text.partition(",")
    return (int(a or 0), int(b or 0))


def to_torch(snapshot: Snapshot) -> dict[str, Any]:
    """Rebuild torch's snapshot dict from memest's form (for torch's own viewer and tools)."""
    frames = [{"filename": f[0], "line": f[1], "name": f[2]} for f in snapshot["frames"]]
    stacks = [[frames[i] for i in s] for s in snapshot["stacks"]]
    ev = snapshot["events"]
    actions, tags = snapshot["actions"], snapshot["tags"]
    pools = snapshot.get("pools", [])
    pool_col = ev.get("pool")
    entries: list[dict[str, Any]] = []
    for i in range(len(ev["action"])):
        st = ev["stack"][i]
        entry: dict[str, Any] = {
            "action": actions[ev["action"][i]],
            "addr": ev["addr"][i],
            "size": ev["size"][i],
            "stream": ev["stream"][i],
            "time_us": ev["time_us"][i],
            "frames": stacks[st] if st >= 0 else [],
        }
        tag = tags[ev["tag"][i]]
        if tag:
            entry["user_metadata"] = tag
        if pool_col is not None and pool_col[i] >= 0:
            entry["pool_id"] = _pool_tuple(pools[pool_col[i]])
        entries.append(entry)
    segments = []
    for seg in snapshot["segments"]:
        blocks = [
            {
                "address": b["address"],
                "size": b["size"],
                "requested_size": b.get("requested_size", b["size"]),
                "state": b.get("state", ""),
                "frames": stacks[b["stack"]] if b.get("stack", -1) >= 0 else [],
            }
            for b in seg["blocks"]
        ]
        active = sum(b["size"] for b in blocks if b["state"].startswith("active"))
        segments.append(
            {
                "device": 0,
                "address": seg["address"],
                "total_size": seg["total_size"],
                "stream": seg.get("stream", 0),
                "segment_type": seg.get("segment_type", "large"),
                "segment_pool_id": _pool_tuple(seg["pool"]),
                "allocated_size": seg.get("allocated_size", active),
                "active_size": active,
                "requested_size": sum(b["requested_size"] for b in blocks),
                "is_expandable": seg.get("is_expandable", False),
                "frames": [],
                "blocks": blocks,
            }
        )
    return {"segments": segments, "device_traces": [entries], "allocator_settings": {}}


def scrub_roots_default() -> list[str]:
    """Directories to strip when scrubbing in this process (cwd and sys.path entries)."""
    import sys

    roots = [os.getcwd(), *[p for p in sys.path if p]]
    return sorted({os.path.abspath(r) for r in roots}, key=len, reverse=True)
