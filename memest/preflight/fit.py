"""Fit the pre-flight laws' coefficients from measured starts, and leave one group out.

A measured start gives every full-initialization term (memest.estimate.account) and the KV that
fills its budget exactly: the KV it allocated minus its usage minus budget. Each law is fitted by
least squares on the starts that carry its term (through the origin for the per-token factors);
a term's uncertainty is its largest absolute residual over those starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memest.estimate.accounting import account
from memest.estimate.phases import phase
from memest.preflight.calibration import Calibration, Coefficients
from memest.preflight.predict import Setup, preflight, setup
from memest.preflight.shape import layer_token_bytes, parameter_bytes
from memest.schema import FullInitTerms, RunReport
from memest.schema.preflight import PreflightRequest

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


def grid_label(report: RunReport) -> str:
    c = report.config
    spec = f"_{c.speculative_method}k{c.num_speculative_tokens}" if c.speculative_method else ""
    return (
        f"s{c.max_num_seqs}_t{c.max_num_batched_tokens}_u{c.gpu_memory_utilization}"
        f"{spec}_tp{c.tensor_parallel_size}"
    )


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
    return Start(
        report_id=report.report_id,
        group=grid_label(report),
        request=req,
        terms=acc.terms,
        exact_kv_bytes=acc.kv_cache_bytes - acc.usage_minus_budget_bytes,
        vllm_kv_bytes=vllm.kv_cache_bytes if vllm is not None else None,
        architecture=str((model_config.get("architectures") or ["unknown"])[0]),
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


def _grid_buffers(st: Start, s: Setup) -> int:
    """Grid-sized buffers: what the weights phase added beyond the parameters, plus runner's."""
    params = parameter_bytes(s.target) + (parameter_bytes(s.drafter) if s.drafter else 0)
    return st.terms.weights_bytes - params + st.terms.runner_buffer_bytes


def fit_coefficients(starts: Sequence[Start]) -> Coefficients:
    """Least-squares coefficients of every law from ``starts`` (see the module docstring).

    Raises:
        ValueError: no start without a drafter (the target laws need one).
    """
    setups = [setup(st.request) for st in starts]
    plain = [(st, s) for st, s in zip(starts, setups, strict=True) if s.drafter is None]
    draft = [(st, s) for st, s in zip(starts, setups, strict=True) if s.drafter is not None]
    if not plain:
        raise ValueError("the fit needs at least one start without a drafter")
    base = _mean([st.terms.baseline_torch_bytes for st, _ in plain])
    act = _origin_fit(
        [s.mbt * layer_token_bytes(s.target) for _, s in plain],
        [st.terms.profile_peak_activation_bytes for st, _ in plain],
    )
    res = _origin_fit(
        [s.mbt * s.target.hidden * s.target.dtype_bytes for _, s in plain],
        [st.terms.profiling_residue_bytes for st, _ in plain],
    )
    out0, out1 = _line_fit(
        [s.graph_layers() for _, s in plain + draft],
        [st.terms.outside_torch_bytes for st, _ in plain + draft],
    )
    act_d = 0.0
    if draft:
        act_d = _origin_fit(
            [s.mbt * layer_token_bytes(s.drafter) for _, s in draft if s.drafter],
            [
                st.terms.profile_peak_activation_bytes - act * s.mbt * layer_token_bytes(s.target)
                for st, s in draft
            ],
        )
    return Coefficients(
        baseline_bytes=round(base),
        baseline_drafter_bytes=round(
            _mean([st.terms.baseline_torch_bytes - base for st, _ in draft])
        ),
        activation_factor=act,
        activation_drafter_factor=act_d,
        outside_bytes=round(out0),
        outside_per_graph_layer_bytes=out1,
        residue_factor=res,
        residue_drafter_bytes=round(
            _mean(
                [
                    st.terms.profiling_residue_bytes
                    - res * s.mbt * s.target.hidden * s.target.dtype_bytes
                    for st, s in draft
                ]
            )
        ),
        grid_buffers_bytes=round(_mean([_grid_buffers(st, s) for st, s in plain])),
        grid_buffers_drafter_bytes=round(_mean([_grid_buffers(st, s) for st, s in draft])),
    )


#: Terms compared one by one; weights and runner buffers are compared as their sum (the split
#: between the weights phase and the KV allocation of grid-sized buffers is not predicted).
TERMS = (
    "baseline_torch_bytes",
    "profile_peak_activation_bytes",
    "outside_torch_bytes",
    "graph_pool_bytes",
    "profiling_residue_bytes",
)


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
        terms = {t: getattr(p, t) - getattr(m, t) for t in TERMS}
        terms["weights_and_buffers"] = (p.weights_bytes + p.runner_buffer_bytes) - (
            m.weights_bytes + m.runner_buffer_bytes
        )
        out.append(Residual(st, r.kv_budget_bytes, terms, r.kv_cache_uncertainty_bytes))
    return out


def uncertainties(res: Sequence[Residual]) -> dict[str, int]:
    """Per term: the largest absolute residual (at least one allocator segment)."""
    out: dict[str, int] = {}
    for t in TERMS:
        out[t] = max([abs(r.term_residuals[t]) for r in res] + [MIN_UNCERTAINTY])
    wb = max([abs(r.term_residuals["weights_and_buffers"]) for r in res] + [MIN_UNCERTAINTY])
    out["runner_buffer_bytes"] = wb
    out["weights_bytes"] = 0
    out["graph_pool_bytes"] = max(out["graph_pool_bytes"], MIN_UNCERTAINTY)
    return out


def calibrate(starts: Sequence[Start], template: Calibration) -> Calibration:
    """``template`` (GPU, versions, priors) with coefficients and uncertainties fitted."""
    coef = fit_coefficients(starts)
    cal = template.model_copy(update={"coefficients": coef, "uncertainty_bytes": {}})
    unc = uncertainties(residuals(starts, cal))
    overs = [r.vllm_error_bytes for r in residuals(starts, cal) if r.vllm_error_bytes is not None]
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
            "vllm_overshoot_bytes": round(_mean(overs)) if overs else None,
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
