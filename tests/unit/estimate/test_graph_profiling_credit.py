"""What a plan start skips of graph-memory profiling's leftovers (memest.estimate.startup_plan.
graph_profiling_kept), against calls 36 and 37's H200 starts: the apply start's allocator history
(graph profiling to the end of init) and what the plan start that followed it allocated.

vLLM 0.33.0: each ``graph_capture()`` (distributed/parallel_state.py) runs on a new
``torch.cuda.Stream()``; the first GEMM on a stream keeps cuBLAS's per-stream workspace, 32 MiB
on an H200. Graph profiling and the real capture are two ``graph_capture()`` calls: two streams,
two workspaces; a plan start skips the profiling one. DeepSeek-V3's shared experts run on the
one process-wide ``aux_stream()`` for up to 256 tokens: that stream's workspace is made by the
first pass that runs them, graph profiling in an apply start, the warm-up in a plan start; and
their ``current_stream()`` call, outside any stream context in a plan start's warm-up, gives
the thread a dedicated stream whose first GEMM keeps one more workspace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memest.analysis.replay import analyze
from memest.estimate.startup_plan import graph_profiling_kept
from memest.schema import RunConfig, RunReport
from memest.snapshot import load_snapshot
from tests.starts import harness_record

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "tests/data/starts"
MiB = 1 << 20


def _non_kv_allocated(rec: dict[str, Any]) -> int:
    """PyTorch-allocated bytes at the end of init, the KV cache left out."""
    return int(rec["end_allocated_bytes"]) - int(rec["kv_bytes"])


@pytest.mark.parametrize(
    ("call", "config", "rows", "credit"),
    [
        # DeepSeek-V3's mix: the profiling stream's workspace (its first GEMM,
        # deepseek_v2.py _min_latency_fused_qkv_a_proj above 16 tokens) and the aux stream's (the
        # shared expert's gate_up): the plan start allocates both again (aux stream, dedicated
        # stream), so it saves nothing
        ("call36", "V3_dsv3mla5l_s64_t2048_fa", [("pass", 32 * MiB), ("side", 32 * MiB)], 0),
        # the 64-head MLA shape, dense: the profiling stream's workspace alone, skipped
        ("call37", "K_mla64h8l_s64_t2048_fa", [("pass", 32 * MiB)], 32 * MiB),
    ],
)
def test_the_credit_is_what_the_plan_start_saved(
    call: str, config: str, rows: list[tuple[str, int]], credit: int
) -> None:
    """The apply start's history read by stream; the plan start (same build, the plan memest
    wrote) ended init with that much less allocated beside its KV cache, within 1 MiB (its
    own small differences: call 36 +232 KiB, call 37 -592 KiB)."""
    snap = load_snapshot(RAW / f"{call}.{config}.apply-hist-stephist.snapshot.rank0.json.gz")
    breakdown = analyze(snap)
    kept = [(r.stream, r.bytes) for r in breakdown.retained if r.phase == "graph_profiling"]
    assert sorted(kept) == sorted(rows)
    report = RunReport(run_id="r", model="m", config=RunConfig(model="m"), breakdown=breakdown)
    assert graph_profiling_kept(report) == credit
    apply = harness_record(call, config, "apply-hist-stephist")
    plan = harness_record(call, config, "plan-memest")
    saved = _non_kv_allocated(apply) - _non_kv_allocated(plan)
    assert abs(saved - credit) < MiB
