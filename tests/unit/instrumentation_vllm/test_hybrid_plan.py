"""The startup plan of a hybrid start: a whole number of its one block (a block id holds a page
in every group's layers), never the uniform page a hybrid's spec leaves unset (which divided by
zero in the plan hook)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memest_instrumentation.vllm.estimates import write_plan
from memest_instrumentation.vllm.state import reset_state

from memest.schema import RunReport

ROOT = Path(__file__).resolve().parents[3]
REPORT = ROOT / "tests/data/starts/call50.N_qwen3next4l_s64_t2048.apply.report.rank0.json"
#: Four groups of one layer each (three gated-delta-net, one attention) share one tensor per
#: layer slot: a block id is one 544-token page of 1,114,112 B, and the start's KV cache was
#: 99,847 blocks x 1,114,112 B = 111,240,740,864 B.
PAGE = 1_114_112


def test_a_hybrid_starts_plan_is_whole_blocks_of_its_page(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("MEMEST_ESTIMATE", "plan")
    report = RunReport.model_validate_json(REPORT.read_text())
    assert report.kv_cache is not None and report.kv_cache.page_size_bytes is None  # unset
    st = reset_state()
    st.plan.fingerprint = "1a11d204fb4eaaee"
    st.vllm.requested_memory_bytes = 127_593_398_272  # 0.85 x the H200's total, as it started
    st.figures.init_free_bytes = 149_356_150_784
    st.figures.profile_headroom_bytes = 170_250_240
    write_plan(report)
    assert st.plan.kv_cache_memory_bytes is not None
    assert st.plan.kv_cache_memory_bytes % PAGE == 0
    assert report.kv_cache.num_blocks * PAGE == 111_240_740_864
    [path] = (tmp_path / "startup_plan").glob("*.json")
    assert json.loads(path.read_text())["kv_cache_memory_bytes"] == st.plan.kv_cache_memory_bytes
