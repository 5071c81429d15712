"""A start's grid, and another grid written as only what changes (vLLM's flag names).

``memest estimate --grid '{"max_num_seqs": 512}'`` overlays the changes on the report's own
configuration, so the drafter, the model length and the compilation settings a start ran with
are kept unless the overlay names them. The field names are vLLM's (``--max-num-seqs`` is
``max_num_seqs``); the report's own names for the drafter (``speculative_method``,
``num_speculative_tokens``) are accepted too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from memest.errors import ConfigError, first_error
from memest.plan.inputs import (
    PlanInput,
    check_compilation_fields,
    check_scheduler,
    plan_input_from_compilation_config,
)
from memest.schema import CapturePlan, GpuInfo, RunConfig
from memest.schema.plan import Sizing

# The compilation_config keys that decide capture sizes; other keys do not change the plan.
CAPTURE_KEYS = (
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
    "max_prefill_cudagraph_capture_tokens",
    "prefill_cudagraph_capture_token_sizes",
    "max_decode_cudagraph_capture_requests",
    "decode_cudagraph_capture_request_sizes",
    "max_decode_cudagraph_capture_tokens",
)
GRID_FIELDS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "gpu_memory_utilization",
    "speculative_config",
    "compilation_config",
    "speculative_method",
    "num_speculative_tokens",
    "kv_cache_dtype",
    "tensor_parallel_size",
)


def _json_object(field: str, value: Any) -> dict[str, Any] | None:
    """A JSON object given inline or as JSON text (vLLM's flags take text); null stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(field, value, f"not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConfigError(field, value, "must be a JSON object (or null)")
    return value


def _drafter(changes: Mapping[str, Any], config: RunConfig) -> tuple[str | None, int]:
    """(method, K) after the overlay; ``"speculative_config": null`` drops the drafter."""
    method, k = config.speculative_method, config.num_speculative_tokens
    if "speculative_config" in changes:
        spec = _json_object("speculative_config", changes["speculative_config"])
        if spec is None:
            return None, 0
        unknown = sorted(set(spec) - {"method", "num_speculative_tokens", "model"})
        if unknown:
            raise ConfigError(
                f"speculative_config.{unknown[0]}", spec[unknown[0]], "not a grid field"
            )
        method = spec.get("method", method)
        k = spec.get("num_speculative_tokens", k)
    method = changes.get("speculative_method", method)
    k = changes.get("num_speculative_tokens", k)
    if method is not None and not isinstance(method, str):
        raise ConfigError("speculative_config.method", method, "must be a method name")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ConfigError("speculative_config.num_speculative_tokens", k, "must be an integer >= 0")
    if method is not None and k == 0:
        raise ConfigError("speculative_config.num_speculative_tokens", k, f"{method} needs K >= 1")
    return method, k


def _capture_settings(changes: Mapping[str, Any], config: RunConfig) -> dict[str, Any]:
    """The capture-size settings of G': the start's mode, plus what the overlay names.

    The report's resolved capture sizes are not carried over: they follow from the grid, and
    G' recomputes them unless the overlay gives sizes itself.
    """
    settings: dict[str, Any] = {}
    if config.cudagraph_mode:
        settings["cudagraph_mode"] = config.cudagraph_mode
    given = _json_object("compilation_config", changes.get("compilation_config")) or {}
    if given:
        check_compilation_fields(given, "grid.compilation_config")
    for key, value in given.items():
        if key in CAPTURE_KEYS:
            settings[key] = value
    return settings


def overlay_config(config: RunConfig, changes: Mapping[str, Any]) -> RunConfig:
    """The start's configuration with ``changes`` applied (vLLM's names).

    Raises:
        ConfigError: an unknown field, or a value of the wrong kind, named.
    """
    unknown = sorted(set(changes) - set(GRID_FIELDS))
    if unknown:
        raise ConfigError(
            f"grid.{unknown[0]}",
            changes[unknown[0]],
            f"not a grid field; expected one of {', '.join(GRID_FIELDS)}",
        )
    method, k = _drafter(changes, config)
    update: dict[str, Any] = {
        "speculative_method": method,
        "num_speculative_tokens": k,
        "compilation_config": _capture_settings(changes, config),
        "cudagraph_capture_sizes": [],
        "max_cudagraph_capture_size": None,
    }
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if name in changes:
            update[name] = changes[name]
    for name in ("gpu_memory_utilization", "kv_cache_dtype", "tensor_parallel_size"):
        if name in changes:
            update[name] = changes[name]
    merged = {**config.model_dump(), **update}
    try:
        out = RunConfig.model_validate(merged)
    except ValidationError as exc:
        where, message, value = first_error(exc)
        raise ConfigError(f"grid.{where or 'grid'}", value, message) from None
    if out.max_num_seqs is not None and out.max_num_batched_tokens is not None:
        check_scheduler(out.max_num_seqs, out.max_num_batched_tokens, out.max_model_len)
    return out


def is_sm100(gpu: GpuInfo | None) -> bool:
    """Compute capability 10.x (GB200, B200): vLLM's larger capture ceiling and the seed's."""
    return bool(gpu and gpu.compute_capability and gpu.compute_capability.startswith("10."))


def plan_input(config: RunConfig, *, sm100: bool | None, gpu: str = "") -> PlanInput:
    """The memest.plan input that decides a start's capture plan, from its configuration.

    ``sm100`` None takes it from ``gpu``, a preset name.

    Raises:
        ConfigError: the configuration has no scheduler limits, or a setting (or the preset)
            is refused.
    """
    if config.max_num_seqs is None or config.max_num_batched_tokens is None:
        raise ConfigError("config", config.model, "max_num_seqs / max_num_batched_tokens unknown")
    settings = {k: v for k, v in config.compilation_config.items() if k in CAPTURE_KEYS}
    if config.cudagraph_mode and "cudagraph_mode" not in settings:
        settings["cudagraph_mode"] = config.cudagraph_mode
    return plan_input_from_compilation_config(
        settings,
        sm100=sm100,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        spec_method=config.speculative_method,
        num_speculative_tokens=config.num_speculative_tokens,
        gpu=gpu,
    )


def overlay_plan(
    config: RunConfig,
    changes: Mapping[str, Any],
    gpu: GpuInfo | str | None,
    sizing: Sizing = "vllm-0.33.0",
) -> tuple[CapturePlan, RunConfig]:
    """``config`` with ``changes`` overlaid, and the capture plan ``sizing`` gives it (vLLM
    0.33.0's by default; memest.plan.release_sizing names each release's).

    The pipeline's first stage (flags -> PlanInput) then the rest in one call of
    memest.plan.resolve, so a pre-flight or a what-if resolves its plan once.

    ``gpu``: a start's GpuInfo, or a preset name (``h200``), which decides vLLM's capture ceiling.

    Raises:
        ConfigError: an unknown field or a refused value, named.
    """
    from memest.plan.resolve import resolve

    out = overlay_config(config, changes)
    sm100: bool | None
    if isinstance(gpu, str):
        sm100, label = None, gpu.lower()  # the preset decides, named if unknown
    else:
        sm100, label = is_sm100(gpu), gpu.name if gpu is not None else ""
    return resolve(plan_input(out, sm100=sm100, gpu=label), sizing), out
