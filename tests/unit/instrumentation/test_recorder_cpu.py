"""The recorder on a machine without CUDA, and its tag / graph-hook logic with a stand-in torch.

Real allocator behaviour is validated on the GPU (lab/validate_pools.py); here the point is
that nothing raises, tags nest and restore, and patches are undone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from memest_instrumentation.torch import Recorder, _compat, current_tag, graphs, tagging

from memest.analysis import analyze
from memest.schema.breakdown import PhaseRecord
from memest.snapshot.tags import StageTag, parse_tag


def test_import_does_not_import_torch() -> None:
    code = "import sys\nimport memest_instrumentation.torch as t\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_recorder_without_cuda_never_raises() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test is about a machine without CUDA")
    rec = Recorder(history=True, max_entries=1000)
    rec.start()
    with rec.phase("weights"), rec.stage("target.full", capture_size=8):
        pass
    reading = rec.reading()
    assert reading.device_source == "none" and reading.device_used_bytes is None
    snap = rec.snapshot()
    rec.stop()
    rec.stop()  # idempotent
    assert [p.name for p in rec.phases] == ["weights"]
    assert len(rec.warnings) == 1 and "CUDA not available" in rec.warnings[0]
    json.dumps(snap)
    bd = analyze(snap, rec.phases)
    assert bd.phases[0].phase == "weights"
    assert bd.event_count == 0


class FakeTorch:
    """Stand-in for the _compat surface: records metadata calls, CUDA 'available'."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, metadata: bool = True) -> None:
        self.metadata: list[str] = []
        self.history: list[Any] = []
        mp = monkeypatch
        mp.setattr(_compat, "cuda_available", lambda: True)
        mp.setattr(_compat, "cuda_initialized", lambda: True)
        mp.setattr(_compat, "current_device", lambda: 0)
        mp.setattr(_compat, "metadata_supported", lambda: metadata)
        mp.setattr(_compat, "set_metadata", self.metadata.append)
        mp.setattr(_compat, "start_history", lambda **kw: self.history.append(kw))
        mp.setattr(_compat, "stop_history", lambda: self.history.append("stop"))
        mp.setattr(_compat, "torch_version_text", lambda: "2.11.0")
        mp.setattr(_compat, "allocator_stats", lambda dev: (10, 5, 12, 6))
        mp.setattr(_compat, "pool_reserved", lambda dev: {"0,0": 10})
        mp.setattr(_compat, "mem_get_info", lambda dev: (90, 100))
        mp.setattr(_compat, "pci_bus_id", lambda dev: None)
        mp.setattr(_compat, "graph_class", lambda: FakeGraph)


class FakeGraph:
    next_pool = 40

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self._pool = pool if pool is not None else (0, FakeGraph.next_pool)
        self.captured = False

    def capture_end(self) -> None:
        self.captured = True

    def pool(self) -> tuple[int, int]:
        if not self.captured:  # torch answers only after a successful capture
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool


@pytest.fixture(autouse=True)
def _no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import memest_instrumentation.torch.recorder as recmod

    def fail(self: Any, device: int) -> None:
        raise RuntimeError("no NVML here")

    monkeypatch.setattr(recmod._Nvml, "open", fail)


def test_stages_nest_and_restore_on_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorch(monkeypatch)
    rec = Recorder().start()
    assert fake.history == [{"max_entries": 1_000_000, "stacks": "python", "context": "alloc"}]
    with rec.phase("capture"):
        with rec.stage("target.piecewise"):
            with pytest.raises(ValueError), rec.stage(None, capture_size=512):
                assert current_tag() == StageTag("capture", "target.piecewise", 512)
                raise ValueError("host error propagates")
            assert current_tag() == StageTag("capture", "target.piecewise")
        assert current_tag() == StageTag("capture")
    assert current_tag() == StageTag()
    rec.stop()
    assert [parse_tag(m) for m in fake.metadata] == [
        StageTag(),
        StageTag("capture"),
        StageTag("capture", "target.piecewise"),
        StageTag("capture", "target.piecewise", 512),
        StageTag("capture", "target.piecewise"),
        StageTag("capture"),
        StageTag(),
        StageTag(),
    ]
    assert fake.history[-1] == "stop"
    assert rec.phases[0].end.device_source == "cudaMemGetInfo"
    assert rec.phases[0].end.device_used_bytes == 10
    assert rec.phases[0].end.pool_reserved_bytes == {"0,0": 10}
    assert any("NVML unavailable" in w for w in rec.warnings)


def test_phase_recorded_even_when_host_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeTorch(monkeypatch)
    rec = Recorder().start()
    with pytest.raises(KeyError), rec.phase("weights"):
        raise KeyError("x")
    rec.stop()
    assert isinstance(rec.phases[0], PhaseRecord) and rec.phases[0].name == "weights"


def test_graph_hooks_tag_capture_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorch(monkeypatch)
    original_begin = FakeGraph.__dict__["capture_begin"]
    rec = Recorder().start()
    assert FakeGraph.__dict__["capture_begin"] is not original_begin
    with rec.phase("capture"), rec.stage("target.full", capture_size=8):
        g = FakeGraph()
        g.capture_begin(pool=(0, 3))
        inside = current_tag()
        g.capture_end()
        g2 = FakeGraph()
        g2.capture_begin()  # pool created by torch: known only at capture_end
        g2.capture_end()
    snap = rec.snapshot()
    rec.stop()
    assert FakeGraph.__dict__["capture_begin"] is original_begin  # unpatched
    assert FakeGraph.__dict__["capture_end"] is not None and not graphs.installed()
    assert inside.pool == "0,3" and inside.stage == "target.full" and inside.window is not None
    caps = [w for w in snap["windows"] if w["kind"] == "capture"]
    assert [w["pool"] for w in caps] == ["0,3", "0,40"]
    assert all(w["end_us"] is not None for w in caps)
    assert any("pool=0,3" in m for m in fake.metadata)


def test_metadata_unsupported_degrades_to_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeTorch(monkeypatch, metadata=False)
    rec = Recorder().start()
    with rec.stage("s"):
        pass
    snap = rec.snapshot()
    rec.stop()
    assert fake.metadata == []
    assert any("cannot tag allocator events" in w for w in rec.warnings)
    assert [w["tag"] for w in snap["windows"]] == ["memest/1;stage=s"]


def test_failing_torch_calls_fail_open(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeTorch(monkeypatch)

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(_compat, "start_history", boom)
    monkeypatch.setattr(_compat, "allocator_stats", boom)
    monkeypatch.setattr(_compat, "set_metadata", boom)
    monkeypatch.setattr(_compat, "raw_snapshot", boom)
    rec = Recorder().start()
    with rec.phase("p"), rec.stage("s"):
        pass
    snap = rec.snapshot()
    rec.stop()
    assert snap["events"]["action"] == []
    assert any("memory history not started" in w for w in rec.warnings)
    assert any("reading failed" in w for w in rec.warnings)
    tagging.set_apply(False)


def test_install_is_reference_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeTorch(monkeypatch)
    original = FakeGraph.__dict__["capture_begin"]
    assert graphs.install() and graphs.install()
    graphs.uninstall()
    assert FakeGraph.__dict__["capture_begin"] is not original
    graphs.uninstall()
    graphs.uninstall()  # extra uninstall is harmless
    assert FakeGraph.__dict__["capture_begin"] is original
