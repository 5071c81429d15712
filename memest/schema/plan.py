"""Capture plans: graphs per runner, as vLLM 0.33.0 sizes them and as the seed's five fields do."""

from __future__ import annotations

from typing import Literal

from memest.schema._base import Field, MemestModel

GraphMode = Literal["PIECEWISE", "FULL", "FULL_VARLEN", "NONE"]
Sizing = Literal["vllm-0.33.0", "seed"]


class RunnerRow(MemestModel):
    """One runner's captures: how many graphs, how wide the widest, how many tokens in all."""

    runner: str = Field(
        description="Stable id, e.g. target.piecewise, target.full, draft.steps.full"
    )
    label: str = Field(description="Human label as in the seed's runner table")
    graph_mode: GraphMode
    q: int = Field(ge=1, description="Tokens per request (1 for PIECEWISE token-keyed sizes)")
    graph_count: int = Field(ge=0)
    sizes: list[int] = Field(description="Captured sizes in the runner's unit (tokens or requests)")
    unit: Literal["tokens", "requests"]
    widest_requests: int | None = Field(default=None, ge=0)
    widest_tokens: int = Field(ge=0)
    sum_tokens: int = Field(ge=0, description="Sum of captured tokens over all sizes")
    note: str = ""
    tier_k: int | None = Field(
        default=None,
        ge=0,
        description="Dynamic-SD tier's K for per-tier rows (target decode at q = 1 + k, or the "
        "one-token draft decodes captured for k)",
    )


class CapturePlan(MemestModel):
    """A resolved capture plan: the runners' graphs for one configuration and one sizing."""

    sizing: Sizing
    gpu: str = Field(description="GPU preset or name, e.g. gb200, h200")
    sm100: bool
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    speculative_method: str | None = None
    num_speculative_tokens: int = Field(default=0, ge=0)
    runners: list[RunnerRow]
    total_graphs: int = Field(ge=0)
    max_cudagraph_capture_size: int | None = None
    warnings: list[str] = Field(default_factory=list)
    cudagraph_mode: str = Field(default="FULL_AND_PIECEWISE", description="Target's CUDAGraphMode")
    performance_mode: str = Field(default="balanced", description="vLLM performance_mode")
    adaptive_verification: bool = False
    dynamic_sd_schedule: list[list[int]] | None = Field(
        default=None, description="num_speculative_tokens_per_batch_size: [start, end, K] rows"
    )
    cudagraph_capture_sizes: list[int] | None = Field(
        default=None, description="Resolved token sizes recorded for buffer sizing"
    )
    resolved_fields: dict[str, int | list[int] | None] = Field(
        default_factory=dict,
        description="The seed's five fields after defaults and validation (seed sizing only)",
    )
