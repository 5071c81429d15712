"""MEMEST_ESTIMATE=apply through the wrappers, on a device whose every term is known."""

from __future__ import annotations

import fake_start
import pytest
from memest_instrumentation.vllm.state import state

# A fake start runs memest's real hooks, which import torch and vLLM.
pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("needs_vllm")]


def _start(monkeypatch: pytest.MonkeyPatch, mode: str) -> tuple[fake_start.FakeDevice, int, int]:
    dev, worker, budget = fake_start.sized_start(monkeypatch, mode)
    return dev, budget, worker.requested_memory


def test_apply_sizes_the_kv_cache_to_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, kv_budget, requested = _start(monkeypatch, "apply")
    assert state().hook_errors == []
    z = dev.sizes
    # in use at the end + the activation peak serving needs again
    usage = dev.used() + z["activation"]
    assert -fake_start.PAGE_ALL < usage - requested <= 0
    terms = state().apply_terms.terms
    assert terms.graph_pool_bytes == z["pool"]
    assert terms.runner_buffer_bytes == z["runner"] + z["outputs"]
    assert terms.profile_peak_activation_bytes == z["activation"]
    # lazily loaded kernels stay after teardown: counted once, in the memory in use
    assert terms.outside_torch_bytes == z["context"] + z["lazy"] + z["graph_objects"]
    assert kv_budget != fake_start.RETURNS["determine_available_memory"]


def test_plan_mode_keeps_vllms_budget_and_writes_a_plan_that_fits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    dev, kv_budget, requested = _start(monkeypatch, "plan")
    assert kv_budget == fake_start.RETURNS["determine_available_memory"]
    plan_kv = state().plan.kv_cache_memory_bytes
    usage = dev.used() + dev.sizes["activation"]
    kv_now = (kv_budget // fake_start.PAGE_ALL) * fake_start.PAGE_ALL
    # the next start with that KV size: same non-KV memory, plan_kv of KV
    assert -fake_start.PAGE_ALL < usage - kv_now + plan_kv - requested <= 0
    assert plan_kv % fake_start.PAGE_ALL == 0


def test_stage_growth_sums_to_the_pools_reserved_growth(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    import json
    import os
    from pathlib import Path

    from memest.schema import RunReport

    dev, _, _ = _start(monkeypatch, "plan")
    path = Path(os.environ["MEMEST_OUTPUT_DIR"]) / "sized-plan" / "report.rank0.json"
    report = RunReport.model_validate(json.loads(path.read_text()))
    assert report.breakdown is not None
    capture = [s for s in report.breakdown.stages if s.phase == "capture"]
    assert sum(s.pool_growth_bytes for s in capture) == report.breakdown.graph_pool_growth_bytes
    assert report.breakdown.graph_pool_growth_bytes == dev.sizes["pool"]
    assert {s.stage: s.graph_count for s in capture} == {"target.piecewise": 2, "target.full": 1}
