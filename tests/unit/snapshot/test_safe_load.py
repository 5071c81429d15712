"""Safe loading: only builtin containers and scalars; every failure names the problem."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from memest.errors import SnapshotFormatError
from memest.snapshot import (
    FORMAT_NAME,
    detect_format,
    empty_snapshot,
    load_snapshot,
    parse_snapshot,
    safe_loads,
)

TORCH_LIKE: dict[str, Any] = {
    "segments": [
        {
            "device": 0,
            "address": 4096,
            "total_size": 2097152,
            "segment_pool_id": (0, 1),
            "blocks": [
                {
                    "address": 4096,
                    "size": 512,
                    "requested_size": 8,
                    "state": "active_allocated",
                    "frames": [{"filename": "/home/u/x.py", "line": 3, "name": "f"}],
                }
            ],
        }
    ],
    "device_traces": [
        [
            {
                "action": "segment_alloc",
                "addr": 4096,
                "size": 2097152,
                "stream": 0,
                "time_us": 1,
                "frames": [{"filename": "/home/u/x.py", "line": 3, "name": "f"}],
                "user_metadata": "memest/1;phase=capture;stage=s;pool=0,1",
            },
            {
                "action": "alloc",
                "addr": 4096,
                "size": 512,
                "stream": 0,
                "time_us": 2,
                "frames": [{"filename": "/home/u/x.py", "line": 3, "name": "f"}],
            },
        ]
    ],
    "allocator_settings": {"expandable_segments": False},
}


class _CreatesFile:
    """Unpickling this would create a file through os.system."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


class _OpensFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("payload_cls", [_CreatesFile, _OpensFile])
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickle_global_refused_before_it_runs(
    tmp_path: Path, payload_cls: type, protocol: int
) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps({"segments": [], "device_traces": [payload_cls(marker)]}, protocol=protocol)
    snap_file = tmp_path / "evil.pickle"
    snap_file.write_bytes(data)
    with pytest.raises(SnapshotFormatError, match="refused pickle global"):
        load_snapshot(snap_file)
    assert not marker.exists()


def test_real_torch_pickle_admitted(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(TORCH_LIKE, protocol=4))
    snap = load_snapshot(path)
    assert snap["format"] == FORMAT_NAME
    assert snap["segments"][0]["pool"] == "0,1"
    assert len(snap["events"]["action"]) == 2


def test_sets_admitted_in_old_protocols() -> None:
    assert safe_loads(pickle.dumps({"a": {1, 2}, "b": frozenset([3])}, protocol=2)) == {
        "a": {1, 2},
        "b": frozenset([3]),
    }


def test_truncated_pickle(tmp_path: Path) -> None:
    data = pickle.dumps(TORCH_LIKE, protocol=4)
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotFormatError, match="truncated"):
        load_snapshot(path)


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps(empty_snapshot())
    path = tmp_path / "cut.json"
    path.write_text(text[:-10])
    with pytest.raises(SnapshotFormatError, match="truncated JSON"):
        load_snapshot(path)


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(json.dumps(empty_snapshot()).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[:20])
    with pytest.raises(SnapshotFormatError, match="gzip"):
        load_snapshot(path)


def test_gzip_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s.json.gz"
    path.write_bytes(gzip.compress(pickle.dumps(TORCH_LIKE)))
    assert load_snapshot(path)["segments"][0]["total_size"] == 2097152


def test_unknown_version() -> None:
    snap = empty_snapshot()
    snap["version"] = 99
    with pytest.raises(SnapshotFormatError, match="unknown snapshot version 99"):
        parse_snapshot(json.dumps(snap).encode())


def test_unknown_format_name() -> None:
    with pytest.raises(SnapshotFormatError, match="unknown snapshot format 'other'"):
        parse_snapshot(json.dumps({"format": "other", "version": 1}).encode())


@pytest.mark.parametrize("key", ["frames", "stacks", "tags", "actions", "events", "segments"])
def test_missing_key_named(key: str) -> None:
    snap = empty_snapshot()
    del snap[key]
    with pytest.raises(SnapshotFormatError, match=f"missing key '{key}'"):
        parse_snapshot(json.dumps(snap).encode())


def test_missing_event_column_named() -> None:
    snap = empty_snapshot()
    del snap["events"]["addr"]
    with pytest.raises(SnapshotFormatError, match="events: missing key 'addr'"):
        parse_snapshot(json.dumps(snap).encode())


def test_column_length_mismatch_named() -> None:
    snap = empty_snapshot()
    snap["actions"] = ["alloc"]
    for col in snap["events"]:
        snap["events"][col] = [0]
    snap["events"]["size"] = [1, 2]
    snap["events"]["stack"] = [-1]
    with pytest.raises(SnapshotFormatError, match="events.size: 2 values, expected 1"):
        parse_snapshot(json.dumps(snap).encode())


def test_index_out_of_range_named() -> None:
    snap = empty_snapshot()
    snap["actions"] = ["alloc"]
    for col in snap["events"]:
        snap["events"][col] = [0]
    snap["events"]["stack"] = [5]
    with pytest.raises(SnapshotFormatError, match="events.stack: index outside"):
        parse_snapshot(json.dumps(snap).encode())


def test_torch_snapshot_missing_key_named() -> None:
    with pytest.raises(SnapshotFormatError, match="missing key 'device_traces'"):
        parse_snapshot(pickle.dumps({"segments": []}))


def test_not_a_snapshot() -> None:
    with pytest.raises(SnapshotFormatError, match="neither a memest snapshot"):
        parse_snapshot(b'{"hello": 1}')


def test_empty_and_unknown_bytes() -> None:
    with pytest.raises(SnapshotFormatError, match="empty file"):
        parse_snapshot(b"")
    with pytest.raises(SnapshotFormatError, match="unknown snapshot format"):
        detect_format(b"PK\x03\x04")


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("segments", 0, "address"), {"a": 1}),
        (("segments", 0, "blocks"), [7]),
        (("segments", 0, "segment_pool_id"), [None]),
        (("device_traces", 0, 0, "action"), ["alloc"]),
        (("device_traces", 0, 0, "frames"), ["not a frame"]),
    ],
)
def test_malformed_torch_fields_are_named(where: tuple[Any, ...], value: object) -> None:
    raw: Any = json.loads(json.dumps(TORCH_LIKE))
    target = raw
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    with pytest.raises(SnapshotFormatError, match="torch-like"):
        parse_snapshot(pickle.dumps(raw, protocol=2), source="torch-like")


def test_memest_segment_pool_must_be_a_pool_id() -> None:
    snap = empty_snapshot()
    snap["segments"] = [{"address": 0, "total_size": 512, "pool": [None], "blocks": []}]
    with pytest.raises(SnapshotFormatError, match=r"segments\[0\]\.pool"):
        parse_snapshot(json.dumps(snap).encode())
