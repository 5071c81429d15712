"""What a start did not record: the drafter's graph pools (synthetic request trace) and its share
of the profile pass's activations (the activation law), checked against real H200 starts of one
model with and without an EAGLE3 drafter (tests/data/starts, copied from reports/vllm/raw)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import memest.estimate.synthetic_trace as estimate_trace
import memest.estimate.terms.setup as terms_setup
from memest.estimate import account, full_init_kv_budget, full_init_terms, what_if
from memest.estimate.model_shape import model_shape
from memest.estimate.runner_buffers import ModelDims
from memest.preflight.calibration import load_calibration, what_if_calibration
from memest.schema import RunReport
from memest.units import GiB, MiB

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "tests" / "data" / "starts"
MODEL = json.loads((ROOT / "examples" / "llama8b.config.json").read_text())
DRAFTER = json.loads((ROOT / "examples" / "eagle3_8b.config.json").read_text())
S, B = "call9.S_llama8b_s128_t4096.apply", "call6.B_llama8b_s32_t2048.apply"
C, E = "call6.C_llama8b_eagle3k3_s64_t4096.apply", "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply"


def _grid_changes() -> Any:
    """lab/whatif_tools.grid_changes: a start's grid as the --grid changes that ask for it."""
    spec = importlib.util.spec_from_file_location("whatif_tools", ROOT / "lab" / "whatif_tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module.grid_changes


grid_changes = _grid_changes()
ACTIVATION_RANGE = load_calibration("h200").uncertainty_bytes["profile_peak_activation_bytes"]


def _real(name: str) -> RunReport:
    return RunReport.model_validate_json((RAW / f"{name}.report.rank0.json").read_text())


def _measured(report: RunReport) -> Any:
    """A start's terms read with the model's shape, as the what-if reads G's: these reports
    predate recorded dimensions, and the prompt-logprobs chunk is derived from the shape."""
    return full_init_terms(report, shape=model_shape(MODEL, tp=report.config.tensor_parallel_size))


def _predict(g: RunReport, g2: RunReport, *, drafter: bool = True, factor: bool = True) -> Any:
    dims = ModelDims.from_report(g, MODEL, drafter=DRAFTER if drafter else None)
    cal = what_if_calibration(g) if factor else None
    return what_if(g, grid_changes(g2.config), dims=dims, calibration=cal)


def test_preflight_and_what_if_share_one_trace() -> None:
    assert terms_setup.pool_bytes is estimate_trace.pool_bytes


@pytest.mark.parametrize(("plain", "eagle"), [(S, C), (S, E), (B, C), (B, E)])
def test_an_added_drafter_s_stages_grow_as_the_drafter_start_measured(
    plain: str, eagle: str
) -> None:
    result = _predict(_real(plain), _real(eagle))
    measured = account(_real(eagle)).terms
    assert measured is not None
    by_stage: dict[str, int] = {}
    for row in result.owners:
        if row.stage.startswith("draft"):
            assert row.law == "synthetic_trace" and row.measured_bytes == 0
            by_stage[row.stage] = by_stage.get(row.stage, 0) + row.predicted_bytes
    drafts = {
        k: v for k, v in measured.graph_pool_by_stage_bytes.items() if k.startswith("draft") and v
    }
    assert by_stage == drafts
    assert sum(drafts.values()) > 64 * MiB  # what the per-owner laws left out before
    assert "synthetic request trace" in result.term_laws["graph_pool_bytes"]


@pytest.mark.parametrize(("g", "g2"), [(C, E), (E, C)])
def test_a_new_k_rewrites_the_later_steps_stage(g: str, g2: str) -> None:
    result = _predict(_real(g), _real(g2))
    measured = account(_real(g2)).terms
    assert measured is not None
    rows = [r for r in result.owners if r.stage == "draft.steps.full"]
    assert rows and all(r.law == "synthetic_trace" for r in rows)
    assert (
        sum(r.predicted_bytes for r in rows)
        == measured.graph_pool_by_stage_bytes["draft.steps.full"]
    )
    # Stages whose graphs do not change with K keep the start's own measurement.
    kept = [r for r in result.owners if r.stage == "draft.step0.piecewise"]
    assert kept and all(r.predicted_bytes == r.measured_bytes for r in kept)


@pytest.mark.parametrize(
    ("g", "g2"), [(a, b) for a in (S, B, C, E) for b in (S, B, C, E) if a != b]
)
def test_captured_stages_move_by_the_synthetic_difference(g: str, g2: str) -> None:
    """Without a snapshot, a stage both grids capture is measured at G + synthetic(G') -
    synthetic(G): every target and drafter pool of the other start, to the byte (a linear law
    missed the target PIECEWISE pool from B to C and E by +92 MiB)."""
    result = _predict(_real(g), _real(g2))
    measured = _measured(_real(g2)).graph_pool_by_stage_bytes
    predicted: dict[str, int] = {}
    for r in result.owners:
        if r.owner != "graph_objects":
            predicted[r.stage] = predicted.get(r.stage, 0) + r.predicted_bytes
    assert {k: v for k, v in predicted.items() if v} == {k: v for k, v in measured.items() if v}


@pytest.mark.parametrize(("g", "g2"), [(S, C), (S, E), (C, S), (E, S)])
def test_the_drafter_s_activation_share_lands_within_the_fit_s_range(g: str, g2: str) -> None:
    result = _predict(_real(g), _real(g2))
    measured = _measured(_real(g2))
    assert result.terms_to is not None
    got = result.terms_to.profile_peak_activation_bytes
    assert abs(got - measured.profile_peak_activation_bytes) <= ACTIVATION_RANGE
    assert "drafter" in result.term_laws["profile_peak_activation_bytes"]


@pytest.mark.parametrize(("g", "g2"), [(S, C), (S, E), (B, C), (B, E), (C, S), (E, S)])
def test_adding_or_dropping_the_drafter_keeps_the_kv_budget_within_0_1_gib(g: str, g2: str) -> None:
    result = _predict(_real(g), _real(g2))
    exact = full_init_kv_budget(_measured(_real(g2)))
    assert result.kv_budget_bytes_to is not None
    assert abs(result.kv_budget_bytes_to - exact) < 0.1 * GiB


def test_without_the_drafter_config_its_pools_are_noted_not_guessed() -> None:
    result = _predict(_real(S), _real(C), drafter=False)
    assert not any(r.stage.startswith("draft") for r in result.owners)
    assert any("draft.step0.piecewise" in n and "the drafter's" in n for n in result.notes)
    assert any("activations in the profile pass are not modelled" in n for n in result.notes)


def test_without_a_calibration_the_activation_holds_the_target_s_only() -> None:
    s = _real(S)
    result = _predict(s, _real(C), factor=False)
    assert result.terms_to is not None
    # Same max_num_batched_tokens: the target's share is unchanged, the drafter's left out.
    assert (
        result.terms_to.profile_peak_activation_bytes == _measured(s).profile_peak_activation_bytes
    )
    assert any("needs a calibration" in n for n in result.notes)
