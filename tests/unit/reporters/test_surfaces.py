"""Report surfaces on a real start: owner labels, nested phases, CLI report and analyze --md."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from memest.cli import main
from memest.reporters.owners import owner_color, owner_key, owner_label
from memest.reporters.views import notes, phase_rows
from memest.schema import RunReport

START = (
    Path(__file__).parents[2]
    / "data"
    / "starts"
    / "call3.A_llama8b_s128_t4096.enable.report.rank0.json"
)
SNAPSHOT = START.with_name("call3.A_llama8b_s128_t4096.enable.snapshot.rank0.json.gz")


def _report() -> RunReport:
    return RunReport.model_validate_json(START.read_text())


def test_hashed_inductor_owners_read_as_compiled_code() -> None:
    owners = {t.owner for t in (_report().breakdown.triggers if _report().breakdown else [])}
    hashed = [o for o in owners if o.startswith("unattributed:call (")]
    assert len(hashed) == 2
    for o in hashed:
        assert owner_key(o) == "compiled_piece"
        assert owner_label(o) == "compiled code (Inductor call; owner not named)"
        assert owner_color(o) == owner_color("compiled_piece")
    other = "unattributed:make_dummy (vllm/v1/worker/gpu/input_batch.py)"
    assert owner_label(other) == "allocated in make_dummy (input_batch.py); owner not named"


def test_phases_nest_by_their_windows() -> None:
    rep = _report()
    assert rep.breakdown is not None
    rows = {r.split.phase: r for r in phase_rows(rep.breakdown.phases, rep.phases)}
    assert rows["kv_cache_alloc"].parent == "initialize_from_config"
    assert rows["graph_profiling.kv"].parent == "graph_profiling.total"
    assert rows["capture"].parent == "compile_or_warm_up_model"
    top = [r for r in rows.values() if r.depth == 0]
    assert [r.split.phase for r in top] == [
        "graph_profiling.total",
        "initialize_from_config",
        "compile_or_warm_up_model",
    ]


def test_notes_keep_no_host_paths() -> None:
    rep = _report()
    n = notes(rep)
    diagnostics = [x for x in rep.notes if x.startswith("history stage row")]
    assert diagnostics
    assert len(n.shown) <= 4
    assert not any("/tmp/" in x or "/work/" in x for x in n.shown + n.more)
    assert not any(x.startswith("history stage row") for x in n.shown)
    assert sum(x.startswith("history stage row") for x in n.more) == len(diagnostics)


def test_report_png_has_labelled_legends_and_a_named_title(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "No artists with labels found" is a UserWarning
        assert main(["report", str(START), str(START), "--png", "--out", str(tmp_path)]) == 0
        assert main(["report", str(START), "--png", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "memest-report-call3.A_llama8b_s128_t4096.enable.md").read_text()
    assert md.startswith("## llama8b · vllm-0.33.0+memest-0.1.0 · 128 seqs · 4096 batched tokens")
    assert "↳ kv_cache_alloc (in initialize_from_config)" in md
    assert "-0.086 †" in md and "† Negative:" in md
    cmp = next(tmp_path.glob("memest-compare-*.md")).read_text()
    assert cmp.startswith("## llama8b: A → B (same build, configuration and KV sizing)")
    assert "| Total | -0.004 | -0.004 | +0.000 | – |" in cmp
    capsys.readouterr()


def test_analyze_md_has_no_empty_widest_column(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(SNAPSHOT), "--md"]) == 0
    out = capsys.readouterr().out
    assert "| Widest |" not in out
    assert "↳ kv_cache_alloc (in initialize_from_config)" in out
    assert "† Negative: the phase gave memory back" in out
