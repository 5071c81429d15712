"""Conversion between torch's snapshot dict and memest's interned JSON form."""

from __future__ import annotations

import copy
import json
from typing import Any

from memest.snapshot import from_torch, scrub_path, to_torch, validate


def _entry(
    action: str, addr: int, size: int, frames: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 7,
        "time_us": 100,
        "frames": frames,
        **extra,
    }


F1 = [
    {"filename": "/home/u/.venv/lib/python3.11/site-packages/vllm/a.py", "line": 1, "name": "f"},
    {"filename": "/home/u/proj/run.py", "line": 9, "name": "main"},
]
RAW: dict[str, Any] = {
    "segments": [
        {
            "device": 0,
            "address": 0x1000,
            "total_size": 2 << 20,
            "segment_pool_id": (0, 2),
            "stream": 7,
            "segment_type": "small",
            "is_expandable": False,
            "blocks": [
                {
                    "address": 0x1000,
                    "size": 512,
                    "requested_size": 100,
                    "state": "active_allocated",
                    "frames": F1,
                }
            ],
        },
        {
            "device": 1,
            "address": 0x9000,
            "total_size": 2 << 20,
            "segment_pool_id": (0, 0),
            "blocks": [],
        },
    ],
    "device_traces": [
        [
            _entry("segment_alloc", 0x1000, 2 << 20, F1, user_metadata="memest/1;stage=s"),
            _entry("alloc", 0x1000, 512, F1, user_metadata="memest/1;stage=s"),
            _entry("alloc", 0x1200, 512, F1),
            _entry("free_requested", 0x1200, 512, []),
        ],
        [],
    ],
}


def test_scrub_path() -> None:
    assert scrub_path("/opt/venv/lib/python3.11/site-packages/vllm/x.py") == "vllm/x.py"
    assert (
        scrub_path("/usr/lib/python3/dist-packages/torch/cuda/graphs.py") == "torch/cuda/graphs.py"
    )
    assert scrub_path("/home/me/src/vllm/vllm/v1/worker/utils.py", ["/home/me/src/vllm"]) == (
        "vllm/v1/worker/utils.py"
    )
    assert scrub_path("/home/me/secret/project/run.py") == "project/run.py"
    assert scrub_path("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"
    assert scrub_path("relative/file.py") == "relative/file.py"


def test_from_torch_interns_and_scrubs() -> None:
    snap = from_torch(copy.deepcopy(RAW), scrub_paths=True)
    validate(snap)
    assert snap["source"]["device"] == 0
    assert snap["frames"] == [["vllm/a.py", 1, "f"], ["run/run.py", 9, "main"]] or snap["frames"][
        0
    ] == ["vllm/a.py", 1, "f"]
    assert all("/home/u" not in f[0] for f in snap["frames"])
    assert snap["stacks"] == [[0, 1]]
    assert snap["actions"] == ["segment_alloc", "alloc", "free_requested"]
    assert snap["events"]["action"] == [0, 1, 1, 2]
    assert snap["events"]["stack"] == [0, 0, 0, -1]
    assert snap["tags"] == ["", "memest/1;stage=s"]
    assert snap["events"]["tag"] == [1, 1, 0, 0]
    assert [s["pool"] for s in snap["segments"]] == ["0,2"]  # device 1's segment dropped
    assert snap["segments"][0]["blocks"][0]["stack"] == 0
    assert "pool" not in snap["events"]
    json.dumps(snap)  # JSON-serialisable


def test_from_torch_keeps_paths_unless_asked() -> None:
    snap = from_torch(copy.deepcopy(RAW))
    assert snap["frames"][0][0] == F1[0]["filename"]


def test_pool_id_per_entry_kept() -> None:
    raw = copy.deepcopy(RAW)
    raw["device_traces"][0][0]["pool_id"] = (0, 5)
    snap = from_torch(raw)
    assert snap["pools"] == ["0,5"]
    assert snap["events"]["pool"] == [0, -1, -1, -1]


def test_round_trip_through_torch_form() -> None:
    snap = from_torch(copy.deepcopy(RAW))
    again = from_torch(to_torch(snap))
    assert again["events"] == snap["events"]
    assert again["tags"] == snap["tags"]
    assert again["frames"] == snap["frames"]
    assert [s["pool"] for s in again["segments"]] == ["0,2"]


def test_event_without_action_named() -> None:
    import pytest

    from memest.errors import SnapshotFormatError

    raw = {"segments": [], "device_traces": [[{"addr": 1, "size": 2}]]}
    with pytest.raises(SnapshotFormatError, match=r"device_traces\[0\]\[0\]"):
        from_torch(raw)
    raw = {"segments": [], "device_traces": [[{"action": "alloc", "addr": "x", "size": 2}]]}
    with pytest.raises(SnapshotFormatError, match="must be integers"):
        from_torch(raw)
