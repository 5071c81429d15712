"""The fit and leave-one-out: on synthetic starts whose truth is known, and on the real starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lab import preflight_fit
from lab.fit import TERMS, Start, calibrate, fit_coefficients, leave_one_out
from memest.estimate import account
from memest.estimate.synthetic_trace import pool_bytes
from memest.estimate.terms.coefficients import Coefficients
from memest.estimate.terms.shape import layer_token_bytes, parameter_bytes
from memest.preflight.calibration import load_calibration
from memest.preflight.predict import preflight, setup
from memest.schema import FullInitTerms, RunReport
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


#: Llama-3-8B's shapes, by hand from tests/data/configs/llama8b.json (bf16: 2 bytes an element).
#: Parameters: 8,030,261,248 (the published count) plus vLLM's rotary cos/sin cache,
#: max_position_embeddings 8192 x head_dim 128.
LLAMA_PARAM_BYTES = 8_030_261_248 * 2 + 8192 * 128 * 2
#: A decoder layer's activation bytes per token: five hidden-wide tensors (5 x 4096), the qkv
#: projection ((32 + 2 x 8) heads x 128), the KV written (8 x 128), gate_up (2 x 14336) and the
#: activation (14336).
LLAMA_LAYER_TOKEN_BYTES = 2 * (5 * 4096 + 48 * 128 + 8 * 128 + 2 * 14336 + 14336)
H200_TOTAL_BYTES = 150_109_880_320  # the calibration's GPU total (memest/preflight/data)


def _request(seqs: int, mbt: int, spec: dict[str, object] | None) -> PreflightRequest:
    return PreflightRequest.model_validate(
        {
            "model_config": LLAMA,
            "max_num_seqs": seqs,
            "max_num_batched_tokens": mbt,
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.85,
            "speculative_config": spec,
        }
    )


def _law_terms(req: PreflightRequest, c: Coefficients) -> FullInitTerms:
    """The terms the laws give with coefficients ``c``, written out here (predict.py's table).

    The target's inputs are the hand figures above. What a test cannot write by hand is read
    from the setup as an input, never as a result: vLLM's grid-sized buffers (added here, and
    subtracted by the fit), the graph-layer count, the drafter's shape and the graph pools
    (no law fits them)."""
    s = setup(req)
    mbt = req.max_num_batched_tokens
    assert mbt is not None
    buf = s.buffers()
    d = s.drafter
    weights = LLAMA_PARAM_BYTES + c.weights_rest_bytes
    activation = c.activation_factor * mbt * LLAMA_LAYER_TOKEN_BYTES + _prompt_chunk(mbt)
    residue = c.residue_bytes + c.residue_factor * mbt * 4096 * 2
    baseline, runner = c.baseline_bytes, c.runner_rest_bytes
    if d is not None:
        weights += parameter_bytes(d)
        activation += c.activation_drafter_factor * mbt * layer_token_bytes(d)
        residue += c.residue_drafter_bytes
        baseline += c.baseline_drafter_bytes
        runner = c.runner_rest_drafter_bytes
    pools = pool_bytes(s.plan, s.target, d, draft_steps=s.draft_steps).by_stage
    return FullInitTerms(
        requested_bytes=math.ceil(H200_TOTAL_BYTES * 0.85),
        baseline_torch_bytes=baseline + buf.get("baseline_torch_bytes", 0),
        weights_bytes=weights + buf.get("weights_bytes", 0),
        profile_peak_activation_bytes=round(activation),
        outside_torch_bytes=round(
            c.outside_bytes + c.outside_per_graph_layer_bytes * s.graph_layers()
        ),
        graph_pool_bytes=sum(pools.values()),
        graph_pool_by_stage_bytes=dict(pools),
        runner_buffer_bytes=runner + buf.get("runner_buffer_bytes", 0),
        profiling_residue_bytes=round(residue) + buf.get("profiling_residue_bytes", 0),
    )


def _prompt_chunk(mbt: int) -> int:
    """A serving step's prompt-logprobs chunk, 1,024 x 128,256 bf16 logits (250.5 MiB), a
    252 MiB segment unless the forward's widest freed block, gate_up's mbt x 28,672 x 2 B,
    holds it (from 8,192 tokens on: 448 MiB); these grids' sampler rows fit freed blocks."""
    return 0 if mbt * 28672 * 2 >= 1024 * 128256 * 2 else 252 << 20


def _synthetic_starts(c: Coefficients) -> list[Start]:
    """Starts whose measured terms are exactly the laws with coefficients ``c``; the KV that
    fills each budget is what the requested memory leaves after them."""
    out = []
    for seqs, mbt, spec in GRIDS:
        req = _request(seqs, mbt, spec)
        terms = _law_terms(req, c)
        exact_kv = terms.requested_bytes - sum(getattr(terms, t) for t in TERMS)
        out.append(Start(f"syn-{seqs}-{mbt}", f"{seqs}/{mbt}", req, terms, exact_kv, None, "X"))
    return out


def test_the_hand_figures_are_the_shapes_the_laws_read() -> None:
    target = setup(_request(128, 4096, None)).target
    assert parameter_bytes(target) == LLAMA_PARAM_BYTES
    assert layer_token_bytes(target) == LLAMA_LAYER_TOKEN_BYTES


def test_fit_recovers_known_coefficients() -> None:
    got = fit_coefficients(_synthetic_starts(TRUTH))
    for name, value in TRUTH.model_dump().items():
        assert getattr(got, name) == pytest.approx(value, rel=1e-6, abs=1), name


def test_the_prediction_gives_the_laws_terms() -> None:
    truth = load_calibration("h200").model_copy(update={"coefficients": TRUTH})
    for seqs, mbt, spec in GRIDS:
        req = _request(seqs, mbt, spec)
        predicted = preflight(req, truth).terms
        expected = _law_terms(req, TRUTH)
        for term in (*TERMS, "requested_bytes"):
            assert getattr(predicted, term) == getattr(expected, term), (seqs, mbt, term)


def test_leave_one_out_on_known_truth_is_exact() -> None:
    truth = load_calibration("h200").model_copy(update={"coefficients": TRUTH})
    loo = leave_one_out(_synthetic_starts(TRUTH), truth)
    assert set(loo) == {f"{s}/{t}" for s, t, _ in GRIDS}
    for rows in loo.values():
        for r in rows:
            assert abs(r.kv_error_bytes) <= 1 << 10  # rounding only


def test_leave_one_out_sees_a_wrong_law() -> None:
    """A start whose activation is 256 MiB off shows up as that error once held out."""
    truth = load_calibration("h200").model_copy(update={"coefficients": TRUTH})
    starts = _synthetic_starts(TRUTH)
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
            # the exact budget less the prompt-logprobs chunk these starts' steps never took
            chunk = acc.kv_cache_bytes - acc.usage_minus_budget_bytes
            chunk -= starts[report.report_id].exact_kv_bytes
            assert chunk == 252 << 20  # 1,024 x 128,256 bf16 logits, rounded up to 2 MiB
            errors.append(vllm.kv_cache_bytes - starts[report.report_id].exact_kv_bytes)
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


def test_without_a_drafter_start_the_drafter_takes_the_targets_factor() -> None:
    """A fit with no start of a drafter cannot measure the drafter's share: its layers take the
    target's factor (the safe side), never 0, which would leave its forward out."""
    plain = [st for st in _synthetic_starts(TRUTH) if st.request.speculative_config is None]
    got = fit_coefficients(plain)
    assert got.activation_drafter_factor == got.activation_factor
    assert got.activation_factor == pytest.approx(TRUTH.activation_factor, rel=1e-6)
