"""The one accounting of a start: identities between its figures, one record per estimator."""

from __future__ import annotations

import json
from pathlib import Path

from memest.demo import demo_reports
from memest.estimate import account, compare
from memest.schema import RunReport

DATA = Path(__file__).parents[2] / "data" / "reports"
EAGLE3_K5 = DATA / "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"


def _report(path: Path) -> RunReport:
    return RunReport.model_validate(json.loads(path.read_text()))


def test_a_report_with_two_measured_records_gets_one_of_each_estimator() -> None:
    report = _report(EAGLE3_K5)
    stored = [r.estimator for r in report.estimate.records] if report.estimate else []
    assert stored.count("measured") == 2  # the plugin's and memest.estimate's, before
    names = [r.estimator for r in account(report).estimators]
    assert names == ["vllm", "memest", "memest-plan", "measured"]


def test_figures_add_up() -> None:
    acc = account(_report(EAGLE3_K5))
    assert acc.definition == "current" and acc.usage_kind == "end_of_init_plus_first_step"
    assert acc.usage_bytes is not None and acc.budget_bytes is not None
    assert acc.usage_minus_budget_bytes == acc.usage_bytes - acc.budget_bytes
    assert acc.non_kv_bytes == acc.usage_bytes - (acc.kv_cache_bytes or 0)
    assert acc.terms is not None
    assert acc.graph_pool_bytes == sum(acc.graph_pool_by_stage_bytes.values())
    assert acc.kv_tokens is not None and acc.max_model_len == 4096
    assert acc.max_concurrency == acc.kv_tokens / 4096
    measured = acc.estimator("measured")
    assert measured is not None
    assert measured.usage_minus_budget_bytes == acc.usage_minus_budget_bytes


def test_the_memest_record_is_the_estimators_own() -> None:
    report = _report(EAGLE3_K5)
    memest = account(report).estimator("memest")
    assert memest == next(r for r in compare(report).records if r.estimator == "memest")


def test_a_report_memest_cannot_recompute_keeps_its_figures_flagged() -> None:
    published = demo_reports()[0]
    acc = account(published)
    assert acc.definition == "stored"
    assert "older definition" in acc.definition_note and "phase" in acc.definition_note
    assert acc.terms is None and acc.usage_bytes is None
    assert acc.graph_pool_bytes == published.breakdown.graph_pool_growth_bytes  # type: ignore[union-attr]
    names = [r.estimator for r in acc.estimators]
    assert names and len(names) == len(set(names))


def test_a_shrinking_stored_pool_is_shown_not_refused() -> None:
    published = demo_reports()[0]
    assert published.breakdown is not None
    split = published.breakdown.phases[0].model_copy(update={"graph_pool_bytes": -1})
    bd = published.breakdown.model_copy(
        update={"stages": [], "graph_pool_growth_bytes": 0, "phases": [split]}
    )
    acc = account(published.model_copy(update={"breakdown": bd}))
    assert acc.definition == "stored" and acc.graph_pool_bytes == -1
