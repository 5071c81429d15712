"""The what-if's typed request and answer: what every surface (CLI, service, lab) asks and reads.

The calibration (what only a fit of measured starts knows, such as the drafter's activation
factor) is an input: memest.preflight owns the fits and hands them in
(memest.preflight.calibration.what_if_calibration), so the estimator never reaches up for them.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from memest.schema import WhatIf
from memest.schema._base import MemestModel


class WhatIfCalibration(MemestModel):
    """Fitted factors of the start's GPU kind; a factor left None is not modelled (noted)."""

    drafter_activation_factor: float | None = Field(
        default=None,
        description="memest.estimate.activation's drafter factor: an added or dropped drafter "
        "moves the activation term by its share",
    )


class WhatIfQuestion(MemestModel):
    """A what-if on one start: grid G' and, optionally, an inverse question."""

    grid: dict[str, Any] = Field(
        default_factory=dict,
        description="G': changes with vLLM's flag names, memest.plan input fields, or a capture "
        "plan; {} is the start's own grid",
    )
    margin_bytes: int = Field(default=0, ge=0, description="Memory memest keeps free")
    kv_tokens: int | None = Field(default=None, description="Inverse: hold this many KV tokens")
    concurrency: int | None = Field(
        default=None, description="Inverse with kv_tokens = C x max_model_len"
    )
    vllm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The vLLM release G' runs (0.33.0 or 0.34.0; unset: the installed one, else "
        "the newest supported): its capture sizing, KV block size and, on 0.34.0, its growable "
        "KV cache's sizing beside memest's",
    )


class TermRow(MemestModel):
    """One full-initialization term at G and at G', and the law that moved it."""

    term: str
    label: str
    bytes_from: int
    bytes_to: int
    law: str


class WhatIfAnswer(MemestModel):
    """The what-if, its terms side by side, vLLM's flag for G' and the inverse answers."""

    what_if: WhatIf
    terms: list[TermRow]
    kv_cache_memory_bytes_to: int | None
    inverse: dict[str, Any] | None = None
