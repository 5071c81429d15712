"""The lab engine's bookkeeping on CPU: every start yields a valid RunReport that memest reads.

CUDA calls are replaced by stand-ins (fixed readings, no graphs), so this checks the engine's
phase order, report fields and summary, not memory figures; those come from the H200 run.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from memest.estimate import compare, what_if
from memest.schema import RunReport

torch = pytest.importorskip("torch")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    lab = importlib.import_module("lab.lab_engine")
    # Small shapes on the CPU: the bookkeeping is what is under test.
    for name, value in {
        "DEVICE": "cpu",
        "HIDDEN": 8,
        "INDEXER_CONTEXT": 16,
        "VOCAB": 64,
        "WEIGHTS_BYTES": 8 << 20,
        "MAX_MODEL_LEN": 1024,
        "HEADS_PADDED": 1,
        "ATTN_HEAD_DIM": 8,
        "QROPE_HEAD_DIM": 8,
        "KV_PAGE_BYTES": 4096,
        "MiB": 1024,  # the profile run's 512 "MiB" indexer stand-in becomes 512 KiB
    }.items():
        monkeypatch.setattr(lab, name, value)

    @contextlib.contextmanager
    def graph(g: Any, pool: Any = None, stream: Any = None) -> Iterator[None]:
        yield

    stats = {
        "reserved_bytes.all.current": 5 << 20,
        "allocated_bytes.all.current": 3 << 20,
        "allocated_bytes.all.peak": 4 << 20,
        "reserved_bytes.all.peak": 6 << 20,
    }
    segments = [
        {"segment_pool_id": (0, 0), "total_size": 1 << 20},
        {"segment_pool_id": (0, 1), "total_size": 2 << 20},
    ]
    cuda = torch.cuda
    for name, value in {
        "init": lambda: None,
        "synchronize": lambda *a: None,
        "empty_cache": lambda: None,
        "reset_peak_memory_stats": lambda *a: None,
        "mem_get_info": lambda *a: (240 << 20, 256 << 20),
        "memory_stats": lambda *a: dict(stats),
        "memory_snapshot": lambda: list(segments),
        "memory_reserved": lambda *a: 0,
        "memory_allocated": lambda *a: 3 << 20,
        "graph_pool_handle": lambda: (0, 1),
        "CUDAGraph": object,
        "graph": graph,
        "get_device_name": lambda *a: "stand-in",
    }.items():
        monkeypatch.setattr(cuda, name, value)
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **k: randn(*a, **k))
    # As the engine's own child processes do: keep gc.collect() cheap.
    gc.freeze()
    yield lab
    gc.unfreeze()


def test_starts_yield_reports_memest_reads(engine: ModuleType, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for grid in ("G", "G2"):
        for estimator in ("vllm", "memest"):
            result = engine.run_start(grid, estimator)
            report = RunReport.model_validate(result["report"])
            assert [p.name for p in report.phases] == [
                "weights",
                "profile_run",
                "graph_profiling",
                "kv_cache_alloc",
                "capture",
                "end",
            ]
            assert [r.estimator for r in compare(report).records] == ["vllm", "memest", "measured"]
            assert (result["lab"]["memest_terms"] is not None) == (estimator == "memest")
            (raw / f"start_{grid}_{estimator}.json").write_text(json.dumps(result))
    g = RunReport.model_validate(json.loads((raw / "start_G_memest.json").read_text())["report"])
    g2 = RunReport.model_validate(json.loads((raw / "start_G2_vllm.json").read_text())["report"])
    assert g.capture_plans[0].total_graphs == 149
    assert g2.capture_plans[0].total_graphs == 245
    assert what_if(g, g2.capture_plans[0]).grid_to.startswith(
        "max_num_seqs 512, max_num_batched_tokens 8192"
    )

    summary = engine.summarize(raw, tmp_path / "lab", "cmd")
    assert {(r["configuration"], r["estimator"]) for r in summary["records"]} == {
        ("G", "vllm"),
        ("G", "memest"),
        ("G2", "vllm"),
        ("G2", "memest"),
    }
    assert all("usage_minus_budget_bytes" in r and "kv_tokens" in r for r in summary["records"])
    assert (tmp_path / "lab" / "lab-h200.md").read_text().startswith("# Lab engine")
