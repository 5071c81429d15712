"""The value a sizing stage hands the rows stage: every runner's graph sizes, resolved once.

vLLM 0.33.0's sizing (memest.plan.vllm033.vllm_sizes) and the seed's (memest.plan.seed.
resolve_seed) each return one :class:`RunnerSizes`; memest.plan.resolve turns it into rows and
reads nothing else, so a plan is sized in one pass: flags -> PlanInput -> vLLM's sizes -> the
seed's tiers -> rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memest.schema.plan import Sizing

if TYPE_CHECKING:  # vllm033.py builds a RunnerSizes itself
    from memest.plan.vllm033 import CudaGraphMode

ResolvedFields = dict[str, int | list[int] | None]


@dataclass(frozen=True)
class DecodeTier:
    """Uniform-decode request sizes at one query length (one tier of a dynamic-SD schedule)."""

    q: int
    requests: list[int]
    tier_k: int | None = None


@dataclass(frozen=True)
class RunnerSizes:
    """One sizing's graph sizes for every runner kind, and what its plan records.

    Attributes:
        sizing: whose rule sized them.
        mode: the CUDA-graph mode the runners capture under (vLLM resolves adaptive
            verification's to FULL_AND_PIECEWISE unless FULL_DECODE_ONLY is asked).
        tokens: PIECEWISE and FULL-mixed token sizes.
        av_tokens: adaptive verification's token sizes.
        decode: uniform-decode tiers of the target's, draft step 0's and multi-module MTP's
            managers (one without dynamic SD).
        block: the DSpark / DFlash block routine's tiers (empty for other drafters).
        one_token: later draft steps' request sizes (q = 1).
        one_token_ks: the K of each later-draft-step row (None: no dynamic SD).
        max_size: the recorded max_cudagraph_capture_size.
        recorded: the recorded cudagraph_capture_sizes.
        warnings: dropped entries and clipped caps, each naming the field.
        resolved: the seed's five fields as resolved (empty for vLLM's sizing).
        captures: False where the sizing captures nothing (vLLM with mode NONE or no sizes).
    """

    sizing: Sizing
    mode: CudaGraphMode
    tokens: list[int]
    av_tokens: list[int]
    decode: list[DecodeTier]
    block: list[DecodeTier]
    one_token: list[int]
    one_token_ks: list[int | None]
    max_size: int
    recorded: list[int]
    warnings: list[str] = field(default_factory=list)
    resolved: ResolvedFields = field(default_factory=dict)
    captures: bool = True
