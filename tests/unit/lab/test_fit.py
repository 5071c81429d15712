"""The fit and leave-one-out: on synthetic starts whose truth is known, and on the real starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import preflight_fit
from lab.fit import Start, calibrate, fit_coefficients, leave_one_out
from memest.estimate import account
from memest.preflight.calibration import Calibration, Coefficients, load_calibration
from memest.preflight.predict import preflight
from memest.schema import RunReport
from memest.schema.preflight import PreflightRequest

ROOT = Path(__file__).resolve().parents[3]
LLAMA = json.loads((ROOT / "tests/data/configs/llama8b.json").read_text())
GIB = 1 << 30
TRUTH = Coefficients(
    baseline_bytes=40 << 20,
    baseline_drafter_bytes=30 << 20,
    weights_rest_bytes=3 << 20,
    activation_factor=1.25,
    activation_drafter_factor=0.5,
    outside_bytes=700 << 20,
    outside_per_graph_layer_bytes=100_000.0,
    residue_bytes=30 << 20,
    residue_factor=0.25,
    residue_drafter_bytes=60 << 20,
    runner_rest_bytes=40 << 20,
    runner_rest_drafter_bytes=150 << 20,
)
GRIDS = [
    (128, 4096, None),
    (32, 2048, None),
    (256, 8192, None),
    (64, 4096, {"method": "eagle3", "num_speculative_tokens": 3}),
    (96, 2048, {"method": "eagle3", "num_speculative_tokens": 5}),
]


def _synthetic_starts(truth: Calibration) -> list[Start]:
    """Starts whose measured terms are exactly the laws with TRUTH's coefficients."""
    out = []
    for seqs, mbt, spec in GRIDS:
        req = PreflightRequest.model_validate(
            {
                "model_config": LLAMA,
                "max_num_seqs": seqs,
                "max_num_batched_tokens": mbt,
                "max_model_len": 4096,
                "gpu_memory_utilization": 0.85,
                "speculative_config": spec,
            }
        )
        r = preflight(req, truth)
        out.append(
            Start(f"syn-{seqs}-{mbt}", f"{seqs}/{mbt}", req, r.terms, r.kv_budget_bytes, None, "X")
        )
    return out


def test_fit_recovers_known_coefficients() -> None:
    truth = load_calibration("h200").model_copy(update={"coefficients": TRUTH})
    got = fit_coefficients(_synthetic_starts(truth))
    for name, value in TRUTH.model_dump().items():
        assert getattr(got, name) == pytest.approx(value, rel=1e-6, abs=1), name


def test_leave_one_out_on_known_truth_is_exact() -> None:
    truth = load_calibration("h200").model_copy(update={"coefficients": TRUTH})
    loo = leave_one_out(_synthetic_starts(truth), truth)
    assert set(loo) == {f"{s}/{t}" for s, t, _ in GRIDS}
    for rows in loo.values():
        for r in rows:
            assert abs(r.kv_error_bytes) <= 1 << 10  # rounding only


def test_leave_one_out_sees_a_wrong_law() -> None:
    """A start whose activation is 256 MiB off shows up as that error once held out."""
    truth = load_calibration("h200").model_copy(update={"coefficients": TRUTH})
    starts = _synthetic_starts(truth)
    bad = starts[2]
    shifted = bad.terms.model_copy(
        update={
            "profile_peak_activation_bytes": bad.terms.profile_peak_activation_bytes + (256 << 20)
        }
    )
    starts[2] = Start(
        bad.report_id, bad.group, bad.request, shifted, bad.exact_kv_bytes - (256 << 20), None, "X"
    )
    held = leave_one_out(starts, truth)[bad.group][0]
    assert held.kv_error_bytes > 200 << 20


def test_committed_calibration_is_the_fit_of_the_committed_starts() -> None:
    starts = preflight_fit.load_starts()
    shipped = load_calibration("h200")
    refit = calibrate(starts, shipped).model_copy(update={"command": shipped.command})
    assert refit == shipped, "run `python lab/preflight_fit.py --write` and commit the result"


def test_every_grid_held_out_is_within_a_quarter_gib_of_its_exact_budget() -> None:
    starts = preflight_fit.load_starts()
    assert len({s.group for s in starts}) >= 5
    loo = leave_one_out(starts, load_calibration("h200"))
    assert set(loo) == {s.group for s in starts}
    for group, rows in loo.items():
        for r in rows:
            assert abs(r.kv_error_bytes) < GIB // 4, (group, r.kv_error_bytes)


def test_vllm_overshoot_is_over_the_starts_vllm_sized_only() -> None:
    """The starts the plugin recorded as sized by vLLM, and vLLM's error on exactly those."""
    starts = {st.report_id: st for st in preflight_fit.load_starts()}
    plugin_says: set[str] = set()
    errors: list[int] = []
    for path in preflight_fit.REPORTS:
        report = RunReport.model_validate_json(path.read_text())
        stored = report.estimate.records if report.estimate is not None else []
        said = [r.note for r in stored] + list(report.notes)
        if report.report_id in starts and any("sized by vllm" in n for n in said):
            plugin_says.add(report.report_id)
            acc = account(report)
            vllm = acc.estimator("vllm")
            assert vllm is not None and vllm.kv_cache_bytes is not None
            assert acc.kv_cache_bytes is not None and acc.usage_minus_budget_bytes is not None
            errors.append(vllm.kv_cache_bytes - (acc.kv_cache_bytes - acc.usage_minus_budget_bytes))
    assert len(plugin_says) >= 2
    assert {i for i, st in starts.items() if st.vllm_sized} == plugin_says
    over = load_calibration("h200").vllm_overshoot
    assert over is not None
    assert (over.starts, over.min_bytes, over.max_bytes) == (len(errors), min(errors), max(errors))
    assert over.min_bytes > 0  # vLLM's own budget is too large on every start it sized


def test_grid_sized_buffers_leave_small_residuals_held_out() -> None:
    """With vLLM's buffers computed, what the fit adds to weights and runner buffers is small:
    each grid held out lands within 32 MiB on both terms."""
    loo = leave_one_out(preflight_fit.load_starts(), load_calibration("h200"))
    for group, rows in loo.items():
        for r in rows:
            for term in ("weights_bytes", "runner_buffer_bytes", "baseline_torch_bytes"):
                assert abs(r.term_residuals[term]) < 32 << 20, (group, term)
