"""Capture plans over HTTP: a thin adapter over memest.plan (no plan arithmetic here)."""

from __future__ import annotations

from typing import Any

from memest.errors import ConfigError
from memest.schema import CapturePlan


def resolve_plan(
    *,
    sizing: str,
    gpu: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    speculative_method: str | None = None,
    num_speculative_tokens: int = 0,
    compilation_config: dict[str, Any] | str | None = None,
    adaptive_verification: bool = False,
) -> CapturePlan:
    """Resolve a CapturePlan with memest.plan for a GPU preset and a vLLM-style config.

    Raises:
        LookupError: memest.plan is not importable (the service answers 503).
        ConfigError: memest.plan rejected an argument (the service answers 422 naming it).
    """
    try:
        from memest.plan import gpu_preset, plan_input_from_compilation_config, resolve
    except ImportError as exc:
        raise LookupError(f"memest.plan is not available ({exc})") from None
    if num_speculative_tokens and speculative_method is None:
        raise ConfigError(
            "num_speculative_tokens", num_speculative_tokens, "needs speculative_method"
        )
    inp = plan_input_from_compilation_config(
        compilation_config,
        sm100=gpu_preset(gpu),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        spec_method=speculative_method,
        num_speculative_tokens=num_speculative_tokens if speculative_method else 0,
        adaptive_verification=adaptive_verification,
        gpu=gpu,
    )
    return resolve(inp, sizing)  # type: ignore[arg-type]
