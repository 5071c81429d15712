"""Estimates over HTTP: a thin adapter over memest.estimate (no estimator arithmetic here)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memest.errors import ConfigError
from memest.schema import EstimateComparison, RunReport, WhatIf


def _estimate_attr(name: str) -> Callable[..., Any] | None:
    try:
        module = importlib.import_module("memest.estimate")
    except ImportError:
        return None
    fn = getattr(module, name, None)
    return fn if callable(fn) else None


def estimate_available() -> str | None:
    """None when memest.estimate.compare exists, else the reason it cannot be used."""
    if _estimate_attr("compare") is None:
        return "memest.estimate.compare is not available"
    return None


def compare_report(report: RunReport) -> EstimateComparison:
    """memest.estimate.compare(report).

    Raises:
        LookupError: memest.estimate has no ``compare`` (the service answers 503).
    """
    fn = _estimate_attr("compare")
    if fn is None:
        raise LookupError("memest.estimate.compare is not available")
    result = fn(report)
    if not isinstance(result, EstimateComparison):
        raise LookupError(f"memest.estimate.compare returned {type(result).__name__}")
    return result


def what_if(report: RunReport, plan: Any) -> Any:
    """memest.estimate.what_if(report, plan): predicted owners and KV budget under another grid.

    Raises:
        LookupError: memest.estimate has no ``what_if`` (the service answers 503).
    """
    fn = _estimate_attr("what_if")
    if fn is None:
        raise LookupError("memest.estimate.what_if is not available")
    return fn(report, plan)


class RunEstimateRequest(BaseModel):
    """A what-if on a stored run: the grid changes as ``memest estimate --grid`` takes them."""

    model_config = ConfigDict(extra="forbid")

    grid: dict[str, Any] = Field(
        default_factory=dict,
        description="Only what changes, with vLLM's flag names (max_num_seqs, "
        "max_num_batched_tokens, max_model_len, gpu_memory_utilization, speculative_config, "
        "compilation_config); {} is the start's own grid",
        examples=[{"max_num_seqs": 32, "max_num_batched_tokens": 2048}],
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Shorthand for grid.gpu_memory_utilization"
    )
    kv_tokens: int | None = Field(
        default=None, gt=0, description="Inverse question: what holds this many KV tokens"
    )
    concurrency: int | None = Field(
        default=None, gt=0, description="Inverse question with kv_tokens = C x max_model_len"
    )
    model_dims: dict[str, Any] | None = Field(
        default=None,
        description="The model's Hugging Face config.json (overrides the run's recorded "
        "model_dims): grid-sized runner buffers move too",
    )
    drafter_dims: dict[str, Any] | None = Field(
        default=None,
        description="The drafter's config.json (overrides the run's recorded drafter_dims): "
        "its weights, KV layers, graph pools and activations when the grid adds or drops the "
        "drafter; without it an added or dropped drafter's weights are not moved (noted)",
    )
    rank: int | None = Field(default=None, ge=0, le=65535, description="Default: the lowest")


class TermRow(BaseModel):
    term: str
    label: str
    bytes_from: int
    bytes_to: int
    law: str


class RunEstimateResponse(BaseModel):
    run_id: str
    rank: int
    what_if: WhatIf
    terms: list[TermRow] = Field(description="Every full-initialization term at G and G'")
    kv_cache_memory_bytes_to: int | None = Field(description="vLLM's flag for G'")
    concurrency_from: float | None = Field(description="Requests of max_model_len at G")
    concurrency_to: float | None = Field(description="Requests of G''s max_model_len at G'")
    inverse: dict[str, Any] | None = None


def run_estimate(report: RunReport, req: RunEstimateRequest) -> RunEstimateResponse:
    """memest.estimate.what_if (and the inverse questions) on a stored report.

    Raises:
        ConfigError: a field of the request is refused (named).
        MemestError: the estimator cannot use the report.
    """
    from memest.estimate import what_if as core_what_if
    from memest.estimate.inverse import inverse_answer, target_tokens
    from memest.estimate.runner_buffers import ModelDims
    from memest.estimate.whatif import term_rows
    from memest.preflight.calibration import drafter_activation_factor

    grid = dict(req.grid)
    if req.gpu_memory_utilization is not None:
        if "gpu_memory_utilization" in grid:
            raise ConfigError(
                "gpu_memory_utilization", req.gpu_memory_utilization, "also given in grid"
            )
        grid["gpu_memory_utilization"] = req.gpu_memory_utilization
    if req.drafter_dims is not None and req.model_dims is None and report.config.model_dims is None:
        raise ConfigError("drafter_dims", "...", "needs model_dims (the run records none)")
    dims = ModelDims.from_report(report, req.model_dims, drafter=req.drafter_dims)
    tokens = target_tokens(report, req.kv_tokens, req.concurrency)
    factor = drafter_activation_factor(report)
    result = core_what_if(report, grid, dims=dims, drafter_activation_factor=factor)
    inverse = None
    if tokens is not None:
        inverse = inverse_answer(
            report,
            result,
            tokens,
            grid,
            lambda r, g: core_what_if(r, g, dims=dims, drafter_activation_factor=factor),
            ("concurrency", req.concurrency)
            if req.concurrency is not None
            else ("kv_tokens", tokens),
        )
    return RunEstimateResponse(
        run_id=report.run_id,
        rank=report.rank,
        what_if=result,
        terms=[TermRow(**row) for row in term_rows(result)],
        kv_cache_memory_bytes_to=result.kv_budget_bytes_to,
        concurrency_from=result.concurrency_from,
        concurrency_to=result.concurrency_to,
        inverse=inverse,
    )
