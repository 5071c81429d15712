"""The one accounting of a start: identities between its figures, one record per estimator."""

from __future__ import annotations

import json
from pathlib import Path

from memest.demo import demo_reports
from memest.estimate import account, compare
from memest.estimate.accounting import budget_split, budget_splits
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


def test_budget_splits_fill_the_budget_with_each_estimators_figures() -> None:
    acc = account(_report(EAGLE3_K5))
    splits = {s.estimator: s for s in budget_splits(acc)}
    assert list(splits) == ["vllm", "memest"]
    terms = acc.terms
    assert terms is not None
    memest = dict((k, b) for k, _, b in splits["memest"].parts)
    # memest holds back its full-initialization terms, its graph pools apart from the rest.
    assert memest["graph_bytes"] == terms.graph_pool_bytes == acc.graph_pool_bytes
    assert memest["non_kv_bytes"] == (
        terms.baseline_torch_bytes
        + terms.weights_bytes
        + terms.profile_peak_activation_bytes
        + terms.outside_torch_bytes
        + terms.runner_buffer_bytes
        + terms.profiling_residue_bytes
        + terms.margin_bytes
    )
    vllm = dict((k, b) for k, _, b in splits["vllm"].parts)
    figures = _report(EAGLE3_K5).vllm
    assert figures is not None and vllm["non_kv_bytes"] == figures.non_kv_cache_memory_bytes
    for split in splits.values():
        assert [k for k, _, _ in split.parts] == ["non_kv_bytes", "graph_bytes", "kv_cache_bytes"]
        assert sum(b for _, _, b in split.parts) == acc.budget_bytes
        record = acc.estimator(split.estimator)
        assert record is not None and split.kv_tokens == record.kv_tokens
        assert split.usage_minus_budget_bytes == record.usage_minus_budget_bytes


def test_no_budget_split_for_an_estimator_without_its_figures() -> None:
    acc = account(_report(EAGLE3_K5))
    vllm = acc.estimator("vllm")
    assert vllm is not None
    bare = acc.model_copy(
        update={
            "estimators": [
                vllm.model_copy(update={"non_kv_cache_bytes": None}),
                *(r for r in acc.estimators if r.estimator != "vllm"),
            ]
        }
    )
    assert [s.estimator for s in budget_splits(bare)] == ["memest"]
    assert budget_split(acc, "measured") is None  # the start itself is the whole-GPU bar
