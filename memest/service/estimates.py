"""Estimates over HTTP: a thin adapter over memest.estimate (no estimator arithmetic here)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memest.errors import ConfigError
from memest.estimate.whatif import TermRow, WhatIfQuestion, answer
from memest.schema import RunReport, WhatIf
from memest.units import kv_cache_memory_flag


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
    vllm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The vLLM release G' runs (0.33.0 or 0.34.0; unset: the installed one, "
        "else the newest supported), as `memest estimate --vllm-version` takes it",
    )


class InverseAnswer(BaseModel):
    """What holds the asked KV tokens (memest.estimate.inverse.inverse_answer)."""

    kv_tokens: int = Field(description="KV tokens asked for (kv_tokens, or C x max_model_len)")
    gpu_memory_utilization: float | None = Field(
        description="The utilization under G' that holds them"
    )
    largest_max_num_seqs: int | None = Field(
        default=None, description="The largest max_num_seqs under G' that still holds them"
    )
    max_num_seqs_ceiling: int | None = Field(default=None, description="Where that search stops")
    max_num_seqs_ceiling_by: str | None = Field(
        default=None, description="What sets the ceiling (max_num_batched_tokens, ...)"
    )


class RunEstimateResponse(BaseModel):
    run_id: str
    rank: int
    what_if: WhatIf
    terms: list[TermRow] = Field(description="Every full-initialization term at G and G'")
    kv_cache_memory_bytes_to: int | None = Field(description="vLLM's flag for G'")
    kv_cache_flag_to: str | None = Field(
        default=None, description="That flag as vLLM takes it: --kv-cache-memory-bytes=N"
    )
    concurrency_from: float | None = Field(description="Requests of max_model_len at G")
    concurrency_to: float | None = Field(description="Requests of G''s max_model_len at G'")
    inverse: InverseAnswer | None = Field(
        default=None, description="The answers to kv_tokens / concurrency, when asked"
    )


def run_estimate(report: RunReport, req: RunEstimateRequest) -> RunEstimateResponse:
    """The what-if (and the inverse questions) on a stored report (memest.estimate.whatif).

    Raises:
        ConfigError: a field of the request is refused (named).
        MemestError: the estimator cannot use the report.
    """
    from memest.estimate.runner_buffers import ModelDims
    from memest.preflight.calibration import what_if_calibration

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
    question = WhatIfQuestion(
        grid=grid,
        kv_tokens=req.kv_tokens,
        concurrency=req.concurrency,
        vllm_version=req.vllm_version,
    )
    result = answer(report, question, calibration=what_if_calibration(report), dims=dims)
    return RunEstimateResponse(
        run_id=report.run_id,
        rank=report.rank,
        what_if=result.what_if,
        terms=result.terms,
        kv_cache_memory_bytes_to=result.kv_cache_memory_bytes_to,
        kv_cache_flag_to=kv_cache_memory_flag(result.kv_cache_memory_bytes_to)
        if result.kv_cache_memory_bytes_to
        else None,
        concurrency_from=result.what_if.concurrency_from,
        concurrency_to=result.what_if.concurrency_to,
        inverse=InverseAnswer.model_validate(result.inverse) if result.inverse else None,
    )
