"""Capture-plan inputs: scheduler limits, speculative decoding and the compilation-config fields.

``PlanInput`` validates on construction, so every resolver can trust it; bad input raises
``ConfigError`` naming the field and the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from memest.errors import ConfigError
from memest.plan.vllm033 import (
    CUDAGRAPH_MODES,
    CudaGraphMode,
    DynamicSDSchedule,
    PerformanceMode,
    dynamic_sd_segments,
)
from memest.schema.preflight import (
    MAX_MODEL_LEN_LIMIT,
    MAX_NUM_BATCHED_TOKENS_LIMIT,
    MAX_NUM_SEQS_LIMIT,
)

#: Compute-capability family 100 (Blackwell data-center parts) or not.
GPU_PRESETS: dict[str, bool] = {"gb200": True, "b200": True, "h100": False, "h200": False}
#: ``vllm serve`` defaults the seed uses per GPU class: (max_num_seqs, max_num_batched_tokens).
SERVE_DEFAULTS: dict[bool, tuple[int, int]] = {True: (1024, 16384), False: (1024, 8192)}

DrafterKind = Literal["target_dependent_ar", "multi_module_mtp", "block", "none"]
#: Block drafters (one FULL block routine each) and the names their tables and plots show.
BLOCK_DRAFTERS: dict[str, str] = {
    "dspark": "DSpark",
    "dflash": "DFlash",
    "dflash2": "DFlash2",
    "lilicorr": "LiLiCorr",
}
#: speculative method → how its drafter captures graphs (vllm/v1/worker/gpu/spec_decode).
SPEC_METHODS: dict[str, DrafterKind] = {
    "eagle": "target_dependent_ar",
    "eagle3": "target_dependent_ar",
    "mtp": "target_dependent_ar",
    "gemma4_mtp": "target_dependent_ar",
    "multi_module_mtp": "multi_module_mtp",
    **dict.fromkeys(BLOCK_DRAFTERS, "block"),
    "ngram": "none",
    "ngram_gpu": "none",
    "suffix": "none",
    "draft_model": "none",
    "extract_hidden_states": "none",
}
#: vLLM 0.33.0's model-specific MTP method names; vLLM runs them as "mtp" (single module unless
#: the draft has several nextn layers: pass "multi_module_mtp" for that).
MTP_ALIASES = (
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
)
SPEC_METHODS.update(dict.fromkeys(MTP_ALIASES, "target_dependent_ar"))

LEGACY_FIELDS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
SEED_FIELDS = (
    "max_prefill_cudagraph_capture_tokens",
    "prefill_cudagraph_capture_token_sizes",
    "max_decode_cudagraph_capture_requests",
    "decode_cudagraph_capture_request_sizes",
    "max_decode_cudagraph_capture_tokens",
)
#: vLLM 0.33.0's CompilationConfig fields (vllm.config.compilation): accepted in a
#: --compilation-config; only the capture-size ones (and SEED_FIELDS) change a capture plan.
VLLM_COMPILATION_FIELDS = (
    "backend",
    "cache_dir",
    "compilation_time",
    "compile_cache_save_format",
    "compile_mm_encoder",
    "compile_ranges_endpoints",
    "compile_sizes",
    "cudagraph_capture_sizes",
    "cudagraph_copy_inputs",
    "cudagraph_decoder_replay",
    "cudagraph_mm_encoder",
    "cudagraph_mode",
    "cudagraph_num_of_warmups",
    "cudagraph_specialize_lora",
    "custom_ops",
    "debug_dump_path",
    "decoder_replay_cudagraph_capture_sizes",
    "decoder_replay_trim_threshold",
    "disabled_custom_ops",
    "dynamic_shapes_config",
    "enabled_custom_ops",
    "encoder_compilation_time",
    "encoder_cudagraph_max_frames_per_batch",
    "encoder_cudagraph_max_vision_items_per_batch",
    "encoder_cudagraph_token_budgets",
    "fast_moe_cold_start",
    "inductor_compile_config",
    "inductor_passes",
    "ir_enable_torch_wrap",
    "local_cache_dir",
    "max_cudagraph_capture_size",
    "mode",
    "pass_config",
    "splitting_ops",
    "static_all_moe_layers",
    "static_forward_context",
    "traced_files",
    "use_inductor_graph_partition",
)


def check_compilation_fields(config: Mapping[str, Any], field: str = "compilation_config") -> None:
    """Refuse a key that is neither vLLM 0.33.0's CompilationConfig field nor a seed field.

    Raises:
        ConfigError: naming the first unknown key.
    """
    known = set(VLLM_COMPILATION_FIELDS) | set(SEED_FIELDS)
    unknown = sorted(str(k) for k in config if k not in known)
    if unknown:
        raise ConfigError(
            f"{field}.{unknown[0]}",
            config[unknown[0]],
            "not a field of vLLM 0.33.0's CompilationConfig nor of the seed's five",
        )


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "must be an integer")
    if value <= 0:
        raise ConfigError(name, value, "must be > 0")
    return value


def _bounded_int(name: str, value: object, limit: int) -> int:
    _positive_int(name, value)
    assert isinstance(value, int)
    if value > limit:
        raise ConfigError(name, value, f"above {limit:,}, the largest memest accepts")
    return value


def check_scheduler(
    max_num_seqs: object, max_num_batched_tokens: object, max_model_len: object = None
) -> None:
    """Refuse scheduler values vLLM 0.33.0 refuses (SchedulerConfig) or no figure survives.

    Raises:
        ConfigError: a value that is not a positive integer, is above memest's limit, or
            max_num_seqs above max_num_batched_tokens (vLLM: "max_num_batched_tokens must be
            greater than or equal to max_num_seqs").
    """
    seqs = _bounded_int("max_num_seqs", max_num_seqs, MAX_NUM_SEQS_LIMIT)
    mbt = _bounded_int(
        "max_num_batched_tokens", max_num_batched_tokens, MAX_NUM_BATCHED_TOKENS_LIMIT
    )
    if max_model_len is not None:
        _bounded_int("max_model_len", max_model_len, MAX_MODEL_LEN_LIMIT)
    if seqs > mbt:
        raise ConfigError(
            "max_num_seqs",
            seqs,
            f"above max_num_batched_tokens={mbt:,}; vLLM 0.33.0 refuses that "
            "(max_num_batched_tokens must be >= max_num_seqs)",
        )


def _size_list(name: str, value: object, *, allow_empty: bool) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(name, value, "must be a list of integers")
    items = list(value)
    if not items and not allow_empty:
        raise ConfigError(name, items, "must not be empty")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError(name, items, f"entry {item!r} is not an integer")
        if item <= 0:
            raise ConfigError(name, items, f"entry {item} must be > 0")
    for a, b in zip(items, items[1:], strict=False):
        if b <= a:
            raise ConfigError(name, items, f"must be strictly ascending ({a} then {b})")
    return tuple(items)


@dataclass(frozen=True)
class PlanInput:
    """Everything that decides a capture plan.

    Args:
        sm100: compute-capability family 100 (GB200, B200); decides vLLM's 1024/512 ceiling and
            the seed's defaults.
        max_num_seqs: scheduler max_num_seqs.
        max_num_batched_tokens: scheduler max_num_batched_tokens.
        spec_method: speculative method (see ``SPEC_METHODS``) or None.
        num_speculative_tokens: K (the widest tier with dynamic SD).
        dynamic_sd: num_speculative_tokens_per_batch_size as (start, end, K) rows.
        adaptive_verification: target verification with variable query lengths.
        performance_mode: vLLM performance_mode; "interactivity" densifies small sizes.
        cudagraph_mode: the target's CUDAGraphMode name.
        gpu: a label for reports (preset name or GPU name).
        cudagraph_capture_sizes, max_cudagraph_capture_size: vLLM's (legacy) sizing fields.
        max_prefill_cudagraph_capture_tokens ... max_decode_cudagraph_capture_tokens: the seed's
            five fields; None means "take the default".

    Derived once on construction (the later stages read them as plain values): ``q`` (the
    target's uniform-decode query length, 1 + K), ``drafter`` (how the drafter captures graphs),
    ``block_q`` (a block drafter's query slots) and ``uses_legacy_fields``.

    Raises:
        ConfigError: a field has a bad value, or legacy and new fields are mixed.
    """

    sm100: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    spec_method: str | None = None
    num_speculative_tokens: int = 0
    dynamic_sd: DynamicSDSchedule | None = None
    adaptive_verification: bool = False
    performance_mode: PerformanceMode = "balanced"
    cudagraph_mode: CudaGraphMode = "FULL_AND_PIECEWISE"
    gpu: str = ""
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    max_prefill_cudagraph_capture_tokens: int | None = None
    prefill_cudagraph_capture_token_sizes: tuple[int, ...] | None = None
    max_decode_cudagraph_capture_requests: int | None = None
    decode_cudagraph_capture_request_sizes: tuple[int, ...] | None = None
    max_decode_cudagraph_capture_tokens: int | None = None
    q: int = field(init=False, repr=False, compare=False)
    drafter: DrafterKind = field(init=False, repr=False, compare=False)
    block_q: int = field(init=False, repr=False, compare=False)
    uses_legacy_fields: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._normalise_lists()
        check_scheduler(self.max_num_seqs, self.max_num_batched_tokens)
        self._check_speculation()
        self._check_modes()
        self._check_capture_fields()
        self._check_not_mixed()
        self._derive()

    def _derive(self) -> None:
        k, method = self.num_speculative_tokens, self.spec_method
        derived = {
            "q": 1 + k,
            "drafter": "none" if method is None else SPEC_METHODS[method],
            # DSpark samples from the anchor: K query slots; the DFlash family adds the bonus slot.
            "block_q": k if method == "dspark" else 1 + k,
            "uses_legacy_fields": any(getattr(self, n) is not None for n in LEGACY_FIELDS),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def _normalise_lists(self) -> None:
        # Lists become tuples, so an input is hashable and the memoized rules accept it.
        if self.dynamic_sd is not None:
            rows = self.dynamic_sd
            if (
                isinstance(rows, str | bytes)
                or not isinstance(rows, Sequence)
                or not all(isinstance(r, Sequence) and not isinstance(r, str) for r in rows)
            ):
                raise ConfigError(
                    "num_speculative_tokens_per_batch_size", rows, "must be [[start, end, K], ...]"
                )
            object.__setattr__(self, "dynamic_sd", tuple(tuple(r) for r in rows))
        for name in (
            "cudagraph_capture_sizes",
            "prefill_cudagraph_capture_token_sizes",
            "decode_cudagraph_capture_request_sizes",
        ):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def _check_speculation(self) -> None:
        """The speculative method, K, the dynamic-SD schedule and adaptive verification agree."""
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError("num_speculative_tokens", k, "must be an integer >= 0")
        method = self.spec_method
        if method is not None and method not in SPEC_METHODS:
            raise ConfigError(
                "speculative_config.method",
                method,
                f"unknown; expected one of {sorted(SPEC_METHODS)}",
            )
        if method is None and k > 0:
            raise ConfigError("num_speculative_tokens", k, "needs a speculative method")
        if method is not None and k == 0:
            raise ConfigError("num_speculative_tokens", k, f"method {method!r} needs K >= 1")
        if self.dynamic_sd is not None:
            if method is None:
                raise ConfigError(
                    "num_speculative_tokens_per_batch_size",
                    [list(e) for e in self.dynamic_sd],
                    "dynamic SD needs a speculative method",
                )
            dynamic_sd_segments(self.dynamic_sd, self.max_num_seqs, k)
        if self.adaptive_verification and method is None:
            raise ConfigError("adaptive_verification", True, "needs a speculative method")

    def _check_modes(self) -> None:
        """Performance and CUDA-graph modes are known, and allow adaptive verification."""
        if self.performance_mode not in get_args(PerformanceMode):
            raise ConfigError("performance_mode", self.performance_mode, "unknown mode")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ConfigError("cudagraph_mode", self.cudagraph_mode, "unknown mode")
        if self.adaptive_verification and self.cudagraph_mode not in (
            "FULL_AND_PIECEWISE",
            "FULL_DECODE_ONLY",
        ):
            raise ConfigError(
                "cudagraph_mode",
                self.cudagraph_mode,
                "adaptive verification needs FULL_AND_PIECEWISE or FULL_DECODE_ONLY",
            )

    def _check_capture_fields(self) -> None:
        """Each size list is valid and under its cap; each cap is a positive integer."""
        if self.cudagraph_capture_sizes is not None:
            _size_list("cudagraph_capture_sizes", self.cudagraph_capture_sizes, allow_empty=False)
        for name in (
            "max_cudagraph_capture_size",
            "max_prefill_cudagraph_capture_tokens",
            "max_decode_cudagraph_capture_requests",
            "max_decode_cudagraph_capture_tokens",
        ):
            value = getattr(self, name)
            if value is not None:
                _positive_int(name, value)
        for list_name, cap_name in (
            ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens"),
            ("decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests"),
            ("cudagraph_capture_sizes", "max_cudagraph_capture_size"),
        ):
            sizes = getattr(self, list_name)
            cap = getattr(self, cap_name)
            if sizes is None:
                continue
            sizes = _size_list(list_name, sizes, allow_empty=list_name != "cudagraph_capture_sizes")
            if cap is not None and sizes and sizes[-1] > cap:
                raise ConfigError(
                    list_name, list(sizes), f"entry {sizes[-1]} is above {cap_name}={cap}"
                )

    def _check_not_mixed(self) -> None:
        """vLLM's legacy sizing fields and the seed's new ones are not given together."""
        legacy = [n for n in LEGACY_FIELDS if getattr(self, n) is not None]
        mixed = [n for n in SEED_FIELDS[:4] if getattr(self, n) is not None]
        if legacy and mixed:
            raise ConfigError(
                legacy[0],
                getattr(self, legacy[0])
                if legacy[0] == LEGACY_FIELDS[1]
                else list(getattr(self, legacy[0])),
                f"legacy sizing field must not be mixed with {', '.join(mixed)}",
            )


def gpu_preset(name: str) -> bool:
    """SM100 or not, for a GPU preset name (gb200, b200, h100, h200).

    Raises:
        ConfigError: an unknown preset.
    """
    key = name.lower()
    if key not in GPU_PRESETS:
        raise ConfigError("gpu", name, f"unknown preset; expected one of {sorted(GPU_PRESETS)}")
    return GPU_PRESETS[key]


def _opt_list(config: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    if key not in config or config[key] is None:
        return None
    value = config[key]
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(key, value, "must be a list of integers")
    return tuple(cast(Sequence[int], value))


def _opt_int(config: Mapping[str, Any], key: str) -> int | None:
    if key not in config or config[key] is None:
        return None
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, value, "must be an integer")
    return value


def plan_input_from_compilation_config(
    compilation_config: Mapping[str, Any] | str | None,
    *,
    sm100: bool | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    spec_method: str | None = None,
    num_speculative_tokens: int = 0,
    dynamic_sd: Sequence[Sequence[int]] | None = None,
    adaptive_verification: bool = False,
    performance_mode: PerformanceMode = "balanced",
    gpu: str = "",
) -> PlanInput:
    """Build a PlanInput from a vLLM-style ``--compilation-config`` dict (or its JSON text).

    ``sm100`` None takes it from ``gpu``, a preset name (``gpu_preset``). Understood keys:
    ``cudagraph_mode`` (name or CUDAGraphMode), ``cudagraph_capture_sizes``,
    ``max_cudagraph_capture_size`` and the seed's five fields. vLLM 0.33.0's other
    CompilationConfig fields (compile settings) do not change capture sizes and are ignored;
    any other key is refused.

    Raises:
        ConfigError: bad JSON, a non-object, an unknown key, a bad value or an unknown GPU
            preset (named).
    """
    if sm100 is None:
        sm100 = gpu_preset(gpu)
    config: Mapping[str, Any]
    if compilation_config is None:
        config = {}
    elif isinstance(compilation_config, str):
        try:
            loaded = json.loads(compilation_config)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                "compilation_config", compilation_config, f"not JSON: {exc}"
            ) from None
        if not isinstance(loaded, dict):
            raise ConfigError("compilation_config", compilation_config, "must be a JSON object")
        config = loaded
    else:
        config = compilation_config
    check_compilation_fields(config)
    mode_value = config.get("cudagraph_mode", "FULL_AND_PIECEWISE")
    mode_name = getattr(mode_value, "name", mode_value)
    if isinstance(mode_name, str):
        mode_name = mode_name.upper()
    if mode_name not in CUDAGRAPH_MODES:
        raise ConfigError(
            "cudagraph_mode", mode_value, f"unknown; expected one of {list(CUDAGRAPH_MODES)}"
        )
    schedule = (
        None if dynamic_sd is None else tuple(tuple(int(x) for x in row) for row in dynamic_sd)
    )
    return PlanInput(
        sm100=sm100,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        spec_method=spec_method,
        num_speculative_tokens=num_speculative_tokens,
        dynamic_sd=cast("DynamicSDSchedule | None", schedule),
        adaptive_verification=adaptive_verification,
        performance_mode=performance_mode,
        cudagraph_mode=cast(CudaGraphMode, mode_name),
        gpu=gpu,
        cudagraph_capture_sizes=_opt_list(config, "cudagraph_capture_sizes"),
        max_cudagraph_capture_size=_opt_int(config, "max_cudagraph_capture_size"),
        max_prefill_cudagraph_capture_tokens=_opt_int(
            config, "max_prefill_cudagraph_capture_tokens"
        ),
        prefill_cudagraph_capture_token_sizes=_opt_list(
            config, "prefill_cudagraph_capture_token_sizes"
        ),
        max_decode_cudagraph_capture_requests=_opt_int(
            config, "max_decode_cudagraph_capture_requests"
        ),
        decode_cudagraph_capture_request_sizes=_opt_list(
            config, "decode_cudagraph_capture_request_sizes"
        ),
        max_decode_cudagraph_capture_tokens=_opt_int(config, "max_decode_cudagraph_capture_tokens"),
    )
