"""Fit the pre-flight laws' coefficients from measured starts, and leave one group out.

A measured start gives every full-initialization term (memest.estimate.account) and the KV that
fills its budget exactly: the KV it allocated minus its usage minus budget. vLLM 0.33.0's
grid-sized buffers (memest.estimate.runner_buffers) are subtracted from the term that holds them
first: the fit sees only what is left. Each law is fitted by least squares on the starts that
carry its term (through the origin for the per-token factors); a term's uncertainty is its
largest absolute residual over those starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memest.estimate.accounting import account
from memest.estimate.activation import sampler_reserve
from memest.estimate.model_shape import model_shape
from memest.estimate.phases import TERM_FIELDS, phase
from memest.estimate.sampler import run_serving_step_bytes
from memest.estimate.terms.coefficients import Coefficients
from memest.estimate.terms.setup import Setup
from memest.estimate.terms.shape import layer_token_bytes, parameter_bytes
from memest.preflight.calibration import Calibration
from memest.preflight.predict import preflight, setup
from memest.schema import FullInitTerms, RunReport, StartAccounting
from memest.schema.preflight import PreflightRequest, VllmOvershoot

#: Fitted residuals below this are reported as this (allocator granularity: one 2 MiB segment).
MIN_UNCERTAINTY = 2 << 20


@dataclass(frozen=True, slots=True)
class Start:
    """One measured start as the fit reads it."""

    report_id: str
    group: str  # the configuration (grid): starts of one group share every input
    request: PreflightRequest
    terms: FullInitTerms
    exact_kv_bytes: int  # measured KV - (usage - budget): the KV that fills the budget exactly
    vllm_kv_bytes: int | None  # vLLM's own estimate of the KV budget for the same start
    architecture: str
    vllm_sized: bool = False  # vLLM's own estimate sized this start's KV cache


def grid_label(report: RunReport) -> str:
    c = report.config
    spec = f"_{c.speculative_method}k{c.num_speculative_tokens}" if c.speculative_method else ""
    return (
        f"s{c.max_num_seqs}_t{c.max_num_batched_tokens}_u{c.gpu_memory_utilization}"
        f"{spec}_tp{c.tensor_parallel_size}"
    )


def sized_by_vllm(acc: StartAccounting) -> bool:
    """Whether vLLM's own estimate sized this start's KV cache: its record then allocates the
    same whole blocks as the start did (compare() says so for the estimator that sized it)."""
    vllm, measured = acc.estimator("vllm"), acc.estimator("measured")
    if vllm is None or measured is None or vllm.usage_minus_budget_bytes is None:
        return False
    return vllm.usage_minus_budget_bytes == measured.usage_minus_budget_bytes


def _chunk_unread(report: RunReport, model_config: Mapping[str, Any]) -> int:
    """The prompt-logprobs chunk a report before recorded dimensions reads none of (its
    serving steps had none either: the full-batch step came later, and on the H200 it added
    the derived 252 MiB on Llama-8B, calls 48-49); 0 for a report with its dimensions."""
    if report.config.model_dims is not None:
        return 0
    shape = model_shape(dict(model_config), tp=report.config.tensor_parallel_size)
    return run_serving_step_bytes(report.config, shape)


def start_from_report(
    report: RunReport, model_config: Mapping[str, Any], draft_config: Mapping[str, Any] | None
) -> Start | None:
    """The fit's view of a report, or None when it cannot calibrate (no warm profile pass, or
    figures memest cannot recompute)."""
    if phase(report, "profile_run.warm") is None:
        return None
    acc = account(report)
    if acc.definition != "current" or acc.terms is None:
        return None
    assert acc.kv_cache_bytes is not None and acc.usage_minus_budget_bytes is not None
    c = report.config
    spec = (
        {"method": c.speculative_method, "num_speculative_tokens": c.num_speculative_tokens}
        if c.speculative_method
        else None
    )
    req = PreflightRequest.model_validate(
        {
            "model_config": dict(model_config),
            "draft_model_config": dict(draft_config) if draft_config else None,
            "gpu": (report.gpu.name.split()[-1] if report.gpu else "h200").lower(),
            "tensor_parallel_size": c.tensor_parallel_size,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "max_model_len": c.max_model_len,
            "gpu_memory_utilization": c.gpu_memory_utilization,
            "speculative_config": spec,
        }
    )
    vllm = acc.estimator("vllm")
    chunk = _chunk_unread(
        report, model_config
    )  # so every start's reading holds what the law derives
    return Start(
        report_id=report.report_id,
        group=grid_label(report),
        request=req,
        terms=acc.terms.model_copy(
            update={
                "profile_peak_activation_bytes": acc.terms.profile_peak_activation_bytes + chunk
            }
        ),
        exact_kv_bytes=acc.kv_cache_bytes - acc.usage_minus_budget_bytes - chunk,
        vllm_kv_bytes=vllm.kv_cache_bytes if vllm is not None else None,
        architecture=str((model_config.get("architectures") or ["unknown"])[0]),
        vllm_sized=sized_by_vllm(acc),
    )


def _origin_fit(xs: Sequence[float], ys: Sequence[float]) -> float:
    den = sum(x * x for x in xs)
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def _line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) by least squares; a flat line through the mean when xs do not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0
    return my - slope * mx, slope


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _rest(st: Start, s: Setup, term: str) -> int:
    """What the measured ``term`` holds beyond vLLM's grid-sized buffers charged to it."""
    return int(getattr(st.terms, term)) - s.buffers().get(term, 0)


def _params(s: Setup) -> int:
    return parameter_bytes(s.target) + (
        parameter_bytes(s.drafter, target_vocab=s.target.vocab) if s.drafter else 0
    )


def _forward(st: Start, s: Setup) -> int:
    """The measured activation less the full-batch step's reserve the law derives, not fits
    (memest.estimate.sampler: the sampler's and the prompt-logprobs chunk's segments)."""
    return st.terms.profile_peak_activation_bytes - sampler_reserve(
        s.target, s.plan.max_num_seqs, s.mbt
    )


def _x_residue(s: Setup) -> int:
    return s.mbt * s.target.hidden * s.target.dtype_bytes


def fit_coefficients(starts: Sequence[Start]) -> Coefficients:
    """Least-squares coefficients of every law from ``starts`` (see the module docstring).

    Raises:
        ValueError: no start without a drafter (the target laws need one).
    """
    setups = [setup(st.request) for st in starts]
    pairs = list(zip(starts, setups, strict=True))
    plain = [(st, s) for st, s in pairs if s.drafter is None]
    draft = [(st, s) for st, s in pairs if s.drafter is not None]
    if not plain:
        raise ValueError("the fit needs at least one start without a drafter")
    base = _mean([_rest(st, s, "baseline_torch_bytes") for st, s in plain])
    act = _origin_fit(
        [s.mbt * layer_token_bytes(s.target) for _, s in plain],
        [_forward(st, s) for st, s in plain],
    )
    res0, res1 = _line_fit(
        [_x_residue(s) for _, s in plain],
        [_rest(st, s, "profiling_residue_bytes") for st, s in plain],
    )
    out0, out1 = _line_fit(
        [s.graph_layers() for _, s in pairs], [st.terms.outside_torch_bytes for st, _ in pairs]
    )
    # With no start of a drafter to fit, its layers take the target's factor: the same
    # compiled-piece liveness, not the smaller share a drafter running on the target's freed
    # blocks measured (0.236 on the H200's EAGLE3 starts), so the law errs on the safe side.
    act_d = act
    if draft:
        act_d = _origin_fit(
            [s.mbt * layer_token_bytes(s.drafter) for _, s in draft if s.drafter],
            [_forward(st, s) - act * s.mbt * layer_token_bytes(s.target) for st, s in draft],
        )
    return Coefficients(
        baseline_bytes=round(base),
        baseline_drafter_bytes=round(
            _mean([_rest(st, s, "baseline_torch_bytes") - base for st, s in draft])
        ),
        weights_rest_bytes=round(
            _mean([_rest(st, s, "weights_bytes") - _params(s) for st, s in pairs])
        ),
        activation_factor=act,
        activation_drafter_factor=act_d,
        outside_bytes=round(out0),
        outside_per_graph_layer_bytes=out1,
        residue_bytes=round(res0),
        residue_factor=res1,
        residue_drafter_bytes=round(
            _mean(
                [
                    _rest(st, s, "profiling_residue_bytes") - res0 - res1 * _x_residue(s)
                    for st, s in draft
                ]
            )
        ),
        runner_rest_bytes=round(_mean([_rest(st, s, "runner_buffer_bytes") for st, s in plain])),
        runner_rest_drafter_bytes=round(
            _mean([_rest(st, s, "runner_buffer_bytes") for st, s in draft])
        ),
    )


#: The predicted terms, compared one by one with the measured ones.
TERMS = tuple(t for t in TERM_FIELDS if t != "margin_bytes")


@dataclass(frozen=True, slots=True)
class Residual:
    """Prediction against measurement for one start (predicted - measured, bytes)."""

    start: Start
    predicted_kv_bytes: int  # memest pre-flight KV budget
    term_residuals: dict[str, int]
    uncertainty_bytes: int

    @property
    def kv_error_bytes(self) -> int:
        return self.predicted_kv_bytes - self.start.exact_kv_bytes

    @property
    def vllm_error_bytes(self) -> int | None:
        v = self.start.vllm_kv_bytes
        return None if v is None else v - self.start.exact_kv_bytes


def residuals(starts: Sequence[Start], cal: Calibration) -> list[Residual]:
    """Predict each start from its config and grid alone and compare with its measurement."""
    out: list[Residual] = []
    for st in starts:
        r = preflight(st.request, cal)
        p, m = r.terms, st.terms
        terms = {t: int(getattr(p, t)) - int(getattr(m, t)) for t in TERMS}
        out.append(Residual(st, r.kv_budget_bytes, terms, r.kv_cache_uncertainty_bytes))
    return out


def uncertainties(res: Sequence[Residual]) -> dict[str, int]:
    """Per term: the largest absolute residual (at least one allocator segment)."""
    return {t: max([abs(r.term_residuals[t]) for r in res] + [MIN_UNCERTAINTY]) for t in TERMS}


def vllm_overshoot(res: Sequence[Residual]) -> VllmOvershoot | None:
    """vLLM's own estimate minus the exact budget over the starts vLLM sized itself (range and
    count); None when none of ``res`` was sized by vLLM. The one definition of the figure."""
    errors = [
        r.vllm_error_bytes for r in res if r.start.vllm_sized and r.vllm_error_bytes is not None
    ]
    if not errors:
        return None
    return VllmOvershoot(starts=len(errors), min_bytes=min(errors), max_bytes=max(errors))


def calibrate(starts: Sequence[Start], template: Calibration) -> Calibration:
    """``template`` (GPU, versions, priors) with coefficients and uncertainties fitted."""
    coef = fit_coefficients(starts)
    cal = template.model_copy(update={"coefficients": coef, "uncertainty_bytes": {}})
    res = residuals(starts, cal)
    unc = uncertainties(res)
    return template.model_copy(
        update={
            "coefficients": coef,
            "uncertainty_bytes": unc,
            "measured_architectures": sorted({st.architecture for st in starts}),
            "measured_tensor_parallel_sizes": sorted(
                {st.request.tensor_parallel_size for st in starts}
            ),
            "measured_drafters": sorted(
                {
                    str(st.request.speculative_config["method"])
                    for st in starts
                    if st.request.speculative_config
                }
            ),
            "vllm_overshoot": vllm_overshoot(res),
            "starts": [st.report_id for st in starts],
        }
    )


def leave_one_out(
    starts: Sequence[Start],
    template: Calibration,
    key: Callable[[Start], str] = lambda st: st.group,
) -> dict[str, list[Residual]]:
    """For each group (by ``key``): fit on the other groups, predict the held-out starts.

    Groups whose removal leaves no start without a drafter are skipped (nothing to fit).
    """
    out: dict[str, list[Residual]] = {}
    for g in sorted({key(st) for st in starts}):
        train = [st for st in starts if key(st) != g]
        held = [st for st in starts if key(st) == g]
        try:
            cal = calibrate(train, template)
        except ValueError:
            continue
        out[g] = residuals(held, cal)
    return out
