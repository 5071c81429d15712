"""Surfaces on real H200 starts: the plan a start ran, KV sizing in compare/history, notes in GiB,
one build label, phase windows, per-rank figure names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.builds.compare import changes
from memest.builds.history import history
from memest.builds.runs import build_label, ran_plan, run_facts, runner_counts
from memest.cli import main
from memest.identity import stored_form
from memest.reporters.breakdown import render_text
from memest.reporters.views import NESTED_NOTE, compare, definition_line, notes, phase_rows
from memest.schema import RunReport

ROOT = Path(__file__).parents[3]
RAW = ROOT / "tests" / "data" / "starts"
E = RAW / "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"
S_APPLY = RAW / "call9.S_llama8b_s128_t4096.apply.report.rank0.json"
S_ENABLE = RAW / "call9.S_llama8b_s128_t4096.enable.report.rank0.json"


def _load(path: Path) -> RunReport:
    return RunReport.model_validate_json(path.read_text())


def test_graph_table_is_the_plan_the_start_ran() -> None:
    rep = _load(E)
    plan = ran_plan(rep)
    assert plan is not None and plan.sizing == "vllm-0.33.0"
    rows = runner_counts(rep)
    assert {r.source for r in rows} == {"plan:vllm-0.33.0"}
    # The stage bars (graphs counted at capture) agree with the table, stage by stage.
    by_stage = {s.stage: s.graph_count for s in rep.breakdown.stages if s.phase == "capture"}
    assert by_stage["draft.steps.full"] == 17
    steps = [r for r in rows if r.runner == "draft.steps.full"]
    assert [r.graph_count for r in steps] == [17]
    assert run_facts(rep).total_graphs == sum(r.graph_count or 0 for r in plan.runners)


def test_compare_names_who_sized_the_kv_cache() -> None:
    a, b = _load(S_ENABLE), _load(S_APPLY)
    diff = {c.field: (c.a, c.b) for c in changes(a, b)}
    assert diff["kv_sized_by"] == ("vllm", "memest")
    cmp = compare(a, b)
    assert (cmp.a.kv_sized_by, cmp.b.kv_sized_by) == ("vllm", "memest")


def test_history_compares_runs_of_one_kv_sizing_only() -> None:
    apply, enable = _load(S_APPLY), _load(S_ENABLE)
    enable = enable.model_copy(update={"created_at": apply.created_at.replace(year=2100)})
    hist = history("llama8b", [apply, enable])
    first, second = hist.points
    assert first.config_fingerprint == second.config_fingerprint
    assert (first.kv_sized_by, second.kv_sized_by) == ("memest", "vllm")
    assert second.compared_with is None and second.regressions == []
    # A second vLLM-sized run of the same configuration is compared with the first one.
    again = enable.model_copy(
        update={"run_id": "again", "created_at": enable.created_at.replace(year=2101)}
    )
    third = history("llama8b", [apply, enable, again]).points[2]
    assert third.compared_with == enable.run_id and third.config_changes == []
    assert set(hist.regression_labels) == {
        "kv_tokens",
        "graph_pool_bytes",
        "usage_minus_budget_bytes",
    }


def test_notes_show_bytes_in_gib_and_name_the_logged_estimate() -> None:
    rep = _load(E)
    raw = next(n for n in rep.notes if n.startswith("graph memory:"))
    logged = int(raw.split("vLLM estimate ")[1].split(" B")[0])
    assert logged == rep.vllm.cudagraph_estimate_bytes
    shown = notes(rep)
    text = next(n for n in shown.main if n.startswith("graph memory:"))
    assert f"vLLM's logged graph estimate {logged / 2**30:.3f} GiB" in text
    assert not any(" B " in n or n.endswith(" B") for n in shown.main)
    assert all(n.startswith("history stage row") or "history" in n for n in shown.diagnostics)
    assert len(shown.diagnostics) == sum(n.startswith("history stage row") for n in rep.notes)
    # A flag value stays as the flag takes it.
    assert any("--kv-cache-memory-bytes 112931241984" in n for n in shown.main)


def test_stored_form_gives_the_default_build_label() -> None:
    rep = _load(E)
    assert rep.build.label == ""
    stored = stored_form(rep)
    assert stored.build.label == "vllm-0.33.0+memest-0.1.0" == build_label(rep)
    labelled = rep.model_copy(update={"build": rep.build.model_copy(update={"label": "PR-7"})})
    assert stored_form(labelled).build.label == "PR-7"


def test_phase_rows_nest_only_inside_a_containing_window() -> None:
    rep = _load(E)
    windows = {p.name: (p.start.time_ns, p.end.time_ns) for p in rep.phases}
    rows = phase_rows(rep.breakdown.phases, rep.phases)
    for row in rows:
        if row.parent is None:
            continue
        (s, e), (ps, pe) = windows[row.split.phase], windows[row.parent]
        assert ps <= s and e <= pe
    parents = {r.split.phase: r.parent for r in rows}
    assert parents["graph_profiling"] == "graph_profiling.total"
    assert parents["graph_profiling.total"] is None
    assert "larger than its outer one" in NESTED_NOTE


def test_published_figures_are_not_called_an_older_definition() -> None:
    from memest.demo import demo_reports
    from memest.estimate import account

    rep = demo_reports()[0]
    line = definition_line(rep, account(rep))
    assert line.startswith("Published figures, not measured by memest: ")
    assert "older definition" not in line


def test_analyze_run_names_figures_as_pages_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.rank0.json").write_text(S_APPLY.read_text())
    assert main(["analyze", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    rep = _load(S_APPLY)
    assert (
        f"| vLLM's logged graph estimate, GiB | {rep.vllm.cudagraph_estimate_bytes / 2**30:.3f} |"
        in out
    )
    assert "stage:" not in out and "_bytes" not in out
    assert main(["analyze", "--run", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["figures"]["vllm_cudagraph_logged_bytes"]["0"] == rep.vllm.cudagraph_estimate_bytes


def test_snapshot_piecewise_count_says_per_piece() -> None:
    from memest.analysis import OwnerRules, analyze
    from memest.schema.breakdown import PhaseRecord
    from memest.snapshot import load_snapshot

    start = (
        ROOT / "tests" / "data" / "starts" / "call3.A_llama8b_s128_t4096.enable.report.rank0.json"
    )
    snap = load_snapshot(
        start.with_name("call3.A_llama8b_s128_t4096.enable.snapshot.rank0.json.gz")
    )
    phases = [PhaseRecord.model_validate(p) for p in snap.get("phases", [])]
    text = render_text(analyze(snap, phases or None, OwnerRules.default()), "GiB", phases)
    assert "(per piece)" in text and "sizes × pieces" in text
