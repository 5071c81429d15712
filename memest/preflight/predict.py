"""Predict every full-initialization term of one rank from a config.json and the grid.

The request is resolved once into a Setup (memest.estimate.terms.setup: shapes, vLLM 0.33.0's
defaults and sizing, the capture plan, the KV block size of the attention backend,
memest.preflight.backends); every term's law and range is memest.estimate.terms.catalog's, the
what-if's too: this module holds no law of its own. The calibration (memest.preflight.calibration)
gives the coefficients where vLLM's code cannot give the number and each term's uncertainty. The
KV budget is memest.estimate.full_init_kv_budget of those terms and the tokens are
memest.estimate.kv_tokens of a KV-cache spec built from the config: the same arithmetic as for a
measured start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memest.errors import ConfigError, first_error
from memest.estimate.indexer import kernel_element_bytes
from memest.estimate.kv import (
    indexer_kv_extra,
    kv_cache_bytes,
    kv_cache_dtype_bytes,
    kv_page_bytes,
    kv_tokens,
    layer_indexer_kv_bytes,
    layer_kv_bytes,
    require_fit,
    require_max_model_len,
)
from memest.estimate.model_shape import VLLM_DEFAULT_MAX_MODEL_LEN, ModelShape, model_shape
from memest.estimate.parallel import ParallelBytes, ParallelLayout, check_env, parallel_bytes
from memest.estimate.phases import budget_bytes, full_init_kv_budget, non_kv_bytes
from memest.estimate.synthetic_trace import IndexerDecode
from memest.estimate.terms import catalog, dsa
from memest.estimate.terms.setup import Setup
from memest.plan import SERVE_DEFAULTS, gpu_preset
from memest.plan.overlay import overlay_plan
from memest.preflight import hybrid
from memest.preflight.backends import kv_block_size
from memest.preflight.calibration import Calibration, calibration_of, load_calibration
from memest.preflight.growable import with_release
from memest.schema import FullInitTerms, KVCacheSpec, RunConfig
from memest.schema.preflight import PreflightRequest, PreflightResult, PreflightTerm
from memest.units import fmt_gib, kv_cache_memory_flag
from memest.vllm_versions import VllmVersion, resolve_version


def _drafter_config(
    req: PreflightRequest, target_cfg: Mapping[str, Any], method: str
) -> dict[str, Any]:
    if req.draft_model_config is not None:
        return dict(req.draft_model_config)
    arch = "LlamaForCausalLMEagle3" if method == "eagle3" else f"{method}-drafter"
    return {**target_cfg, "num_hidden_layers": 1, "architectures": [arch]}


def calibrated_vllm(gpu: str) -> VllmVersion:
    """The vLLM release the GPU kind's calibration models (an uncalibrated kind: the installed
    release, else the newest): its defaults fill every flag the request leaves unset
    (memest.vllm_versions, one row per release)."""
    cal = calibration_of(gpu)
    return resolve_version(cal.vllm_version if cal is not None else None)


def setup(req: PreflightRequest, vllm: VllmVersion | None = None) -> Setup:
    """Shapes, grid and capture plan of a request, with ``vllm``'s defaults (None: the release
    the GPU kind's calibration models) and the KV block size of the release the request names
    (``vllm_version``; unset: the installed, else the newest).

    Raises:
        ConfigError: the config, a flag or the grid is refused (the field is named).
    """
    sm100 = gpu_preset(req.gpu)
    cfg = req.model_config_json
    target = model_shape(
        cfg, tp=req.tensor_parallel_size, dtype=req.dtype, quantization=req.quantization
    )
    vllm = vllm or calibrated_vllm(req.gpu)
    serve = vllm.serve_defaults
    seqs, mbt = (
        SERVE_DEFAULTS[sm100] if sm100 else (serve.max_num_seqs, serve.max_num_batched_tokens)
    )
    base = RunConfig(
        model=target.architecture,
        max_num_seqs=req.max_num_seqs or seqs,
        max_num_batched_tokens=req.max_num_batched_tokens or mbt,
        max_model_len=_max_model_len(req, cfg, target),
        gpu_memory_utilization=vllm.gpu_memory_utilization(req.gpu_memory_utilization),
        tensor_parallel_size=req.tensor_parallel_size,
        kv_cache_dtype=req.kv_cache_dtype,
        quantization=req.quantization or (target.fp8 and "fp8"),
    )
    changes: dict[str, Any] = {}
    if req.speculative_config is not None:
        changes["speculative_config"] = {
            k: v for k, v in req.speculative_config.items() if k != "model"
        }
    if req.compilation_config is not None:
        changes["compilation_config"] = req.compilation_config
    plan, config = overlay_plan(base, changes, req.gpu)  # the what-if's grid edge too
    drafter = None
    if config.speculative_method:
        draft_cfg = _drafter_config(req, cfg, config.speculative_method)
        drafter = model_shape(draft_cfg, tp=req.tensor_parallel_size, dtype=req.dtype)
    # The KV block size follows the release predicted for (0.34.0 tries 64 tokens, 0.33.0 16);
    # the calibration's release gives only the flags the request leaves unset.
    block, backend = kv_block_size(
        mla=target.family == "mla",
        sm100=sm100,
        backend=req.attention_backend,
        block_size=req.block_size,
        sparse=target.sparse,
        heads=target.heads,
        vllm=resolve_version(req.vllm_version),
    )
    indexer = None
    if target.sparse:
        dsa.check_kv_dtype(req.kv_cache_dtype)
        assert config.max_model_len is not None
        indexer = IndexerDecode(config.max_model_len, kernel_element_bytes(sm100))
    notes = (
        ()
        if "max_position_embeddings" in cfg
        else (
            "config.json has no max_position_embeddings: max_model_len defaults to vLLM 0.33.0's "
            f"{VLLM_DEFAULT_MAX_MODEL_LEN} (vLLM warns the same)",
        )
    )
    padded = _flash_attn_version(req) == FA_PADS_MLA_V
    parallel = _parallel(req, target, sm100)
    s = Setup(
        target,
        drafter,
        config,
        plan,
        req.gpu.lower(),
        block,
        backend,
        notes,
        padded,
        parallel,
        indexer,
        model_config=cfg,
    )
    # a hybrid's block tables are one per KV-cache group (memest.estimate.runner_buffers)
    spec = hybrid.kv_spec(cfg, s, kv_spec(s))
    return replace(s, hybrid_kv=spec) if spec.groups else s


def _parallel(req: PreflightRequest, target: ModelShape, sm100: bool) -> ParallelBytes:
    """What TP adds on one rank: NCCL's ring, the all-reduce buffers (memest.estimate.parallel)."""
    layout = ParallelLayout(
        tensor_parallel_size=req.tensor_parallel_size,
        moe=target.experts > 0,  # vLLM builds the ep group for every MoE model
        custom_all_reduce=not req.disable_custom_all_reduce,
        compute_capability="10.0" if sm100 else "9.0",
        hidden_size=target.hidden,
        env=check_env(req.environment),
    )
    return parallel_bytes(layout)


#: The FlashAttention version whose MLA prefill pads v to the qk head dim (vLLM 0.33.0).
FA_PADS_MLA_V = 2


def _flash_attn_version(req: PreflightRequest) -> int | None:
    """--attention-config's flash_attn_version (2, 3 or 4), None when not given."""
    value = (req.attention_config or {}).get("flash_attn_version")
    if value is not None and (isinstance(value, bool) or value not in (2, 3, 4)):
        raise ConfigError("attention_config.flash_attn_version", value, "expected 2, 3 or 4")
    return value


def _max_model_len(req: PreflightRequest, cfg: Mapping[str, Any], target: ModelShape) -> int:
    """--max-model-len, refused above the config's maximum as vLLM 0.33.0 refuses it."""
    if req.max_model_len is None:
        return target.max_position
    limit = cfg.get("model_max_length")
    if (
        "max_position_embeddings" in cfg
        and req.max_model_len > target.max_position
        and not (isinstance(limit, int) and req.max_model_len <= limit)
    ):
        raise ConfigError(
            "max_model_len",
            req.max_model_len,
            f"above the config's max_position_embeddings={target.max_position}; vLLM 0.33.0 "
            "refuses that unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (positions past it break RoPE)",
        )
    return req.max_model_len


def kv_spec(s: Setup) -> KVCacheSpec:
    """The KV-cache spec of one rank: MHA/GQA K and V per head, or MLA's latent, per layer, in
    --kv-cache-dtype (the drafter's layers share the target's blocks and dtype)."""
    shapes = [s.target] + ([s.drafter] if s.drafter is not None else [])
    kv_dtype = s.config.kv_cache_dtype
    per_token = sum(
        (layer_kv_bytes(m, kv_dtype) + layer_indexer_kv_bytes(m)) * m.num_layers for m in shapes
    )
    layers = sum(m.num_layers for m in shapes)
    t = s.target
    extra: dict[str, Any] = {}
    if t.family == "mla":
        extra = {"kv_lora_rank": t.kv_lora_rank, "qk_rope_head_dim": t.qk_rope_head_dim}
        extra.update(indexer_kv_extra(t))
    return KVCacheSpec(
        kind="mla" if t.family == "mla" else "full_attention",
        num_layers=layers,
        num_kv_heads=1 if t.family == "mla" else t.kv_heads,
        head_size=t.kv if t.family == "mla" else t.head_dim,
        dtype=kv_dtype or "auto",
        dtype_bytes=kv_cache_dtype_bytes(kv_dtype, t.dtype_bytes),
        block_size=s.block_size,
        page_size_bytes=per_token * s.block_size,
        extra=extra,
    )


def _unmeasured(s: Setup, cal: Calibration) -> tuple[dict[str, float], list[str]]:
    """Relative widening per term for what no calibration start measured, and the notes."""
    widen: dict[str, float] = {}
    notes: list[str] = []
    w = cal.unmeasured_widening
    if s.target.architecture not in cal.measured_architectures:
        notes.append(
            f"{s.target.architecture} ({s.target.family}) has no measured start in the "
            f"{cal.label} calibration (measured: {', '.join(cal.measured_architectures)}): its "
            "activation, graph-pool, residue and buffer terms are extrapolated from those "
            "and carry the wider prior uncertainty"
        )
        for term, rel in w.items():
            widen[term] = max(widen.get(term, 0.0), rel)
    method = s.config.speculative_method
    if method and method not in cal.measured_drafters:
        sampling = ", its draft logits per step as vLLM allocates them" * (method == "dspark")
        notes.append(
            f"drafter {method} has no measured start: modelled as EAGLE3's one-layer program"
            f"{sampling} with the wider prior uncertainty"
        )
        for term, rel in w.items():
            widen[term] = max(widen.get(term, 0.0), rel)
    return widen, notes


def _uncertainties(
    s: Setup, cal: Calibration, laws: Mapping[str, tuple[int, str]]
) -> tuple[dict[str, int], list[str]]:
    widen, notes = _unmeasured(s, cal)
    out: dict[str, int] = {}
    for term, (value, _) in laws.items():
        u = cal.uncertainty_bytes.get(term, 0)
        out[term] = u + round(widen.get(term, 0.0) * value)
    family = catalog.law_ranges(s, cal.coefficients)
    for term, extra in family.items():
        out[term] = out.get(term, 0) + extra
    notes += _family_notes(s, family)
    tp = s.config.tensor_parallel_size
    if tp not in cal.measured_tensor_parallel_sizes:
        out["outside_torch_bytes"] += s.parallel.uncertainty_bytes
        notes.append(
            f"tensor_parallel_size={tp} has no measured start: what TP adds outside PyTorch per "
            f"rank ({fmt_gib(s.parallel.outside_torch_bytes)} GiB: NCCL's ring buffers over "
            f"{s.parallel.channels} channels and vLLM's all-reduce buffers) is derived from "
            "vLLM 0.33.0's and NCCL's code, not measured; its range is widened by "
            f"{fmt_gib(s.parallel.uncertainty_bytes)} GiB (NCCL picks the channel count from "
            "the topology; its device code is not sized)"
        )
    return out, notes


def _family_notes(s: Setup, ranges: Mapping[str, int]) -> list[str]:
    notes = [dsa.note(s.target, ranges["graph_pool_bytes"])] if s.indexer is not None else []
    if "profile_peak_activation_bytes" in ranges:
        notes.append(
            "MoE: the routed experts' caches live in the fused-MoE workspace (profiling residue), "
            "so the activation law leaves them out; its range holds them "
            f"({ranges['profile_peak_activation_bytes']} B), which the lab's MoE starts (torch "
            "stand-ins for the fused-MoE kernels) could not measure apart"
        )
    if "mla_context_bytes" in ranges:
        notes.append(
            "MLA: the term holds one full context chunk; a step whose cached context fills a "
            "second chunk needs one more kv_nope, and FlashAttention 2 pads v (the range holds "
            f"both: {ranges['mla_context_bytes']} B)"
        )
    return notes


def preflight(req: PreflightRequest, calibration: Calibration | None = None) -> PreflightResult:
    """Predict one rank's full-initialization terms, its KV budget, tokens and concurrency.

    Raises:
        ConfigError: the config, a flag, the grid or the GPU kind is refused (named).
    """
    row = resolve_version(req.vllm_version)
    cal = calibration or load_calibration(req.gpu)
    s = setup(req, resolve_version(cal.vllm_version))
    laws = catalog.laws(s, cal.coefficients)
    util = s.config.gpu_memory_utilization
    assert util is not None
    terms = FullInitTerms(
        requested_bytes=budget_bytes(cal.total_bytes, util),
        **{name: value for name, (value, _) in laws.items()},
        source=f"pre-flight ({cal.label})",
    )
    unc, notes = _uncertainties(s, cal, laws)
    result = _result(req, s, cal, terms, laws, unc, [*s.notes, *notes])
    return with_release(result, row, req, cal.total_bytes)


def _result(
    req: PreflightRequest,
    s: Setup,
    cal: Calibration,
    terms: FullInitTerms,
    laws: Mapping[str, tuple[int, str]],
    unc: Mapping[str, int],
    notes: list[str],
) -> PreflightResult:
    spec = hybrid.kv_spec(req.model_config_json, s, kv_spec(s))
    require_fit(non_kv_bytes(terms), terms.requested_bytes, value=s.config.gpu_memory_utilization)
    budget = full_init_kv_budget(terms)
    length = s.config.max_model_len or 1
    require_max_model_len(spec, budget, length)
    tokens = kv_tokens(spec, budget, length, s.mbt)
    spread = sum(unc.values())
    kv_cache = kv_cache_bytes(spec, budget)
    details = [
        PreflightTerm(name=n, bytes=v, uncertainty_bytes=unc[n], law=law)
        for n, (v, law) in laws.items()
    ]
    return PreflightResult(
        model=s.target.architecture,
        family=s.target.family,
        measured_family=s.target.architecture in cal.measured_architectures,
        gpu=s.gpu,
        calibration=cal.label,
        tensor_parallel_size=s.config.tensor_parallel_size,
        max_num_seqs=s.plan.max_num_seqs,
        max_num_batched_tokens=s.mbt,
        max_model_len=length,
        gpu_memory_utilization=s.config.gpu_memory_utilization,
        speculative_method=s.config.speculative_method,
        num_speculative_tokens=s.config.num_speculative_tokens,
        total_graphs=s.plan.total_graphs,
        attention_backend=s.attention_backend,
        block_size=s.block_size,
        terms=terms,
        term_details=details,
        non_kv_bytes=non_kv_bytes(terms),
        kv_budget_bytes=budget,
        kv_cache_bytes=kv_cache,
        kv_cache_flag=kv_cache_memory_flag(kv_cache),
        kv_cache_uncertainty_bytes=spread,
        kv_tokens=tokens,
        kv_tokens_low=kv_tokens(spec, max(budget - spread, 0), length, s.mbt),
        kv_tokens_high=kv_tokens(spec, budget + spread, length, s.mbt),
        kv_bytes_per_token=kv_page_bytes(spec) // spec.block_size,
        max_concurrency=tokens / length,
        kv_cache=spec,
        vllm_overshoot=cal.vllm_overshoot if _calibration_describes(s, cal) else None,
        notes=notes,
    )


def _calibration_describes(s: Setup, cal: Calibration) -> bool:
    """Whether the calibration's starts measured this architecture at this TP size."""
    return (
        s.target.architecture in cal.measured_architectures
        and s.config.tensor_parallel_size in cal.measured_tensor_parallel_sizes
    )


def request_from(fields: Mapping[str, Any]) -> PreflightRequest:
    """A PreflightRequest from a mapping (the CLI's flags, a JSON body), first error named.

    Raises:
        ConfigError: naming the first field pydantic refuses.
    """
    from pydantic import ValidationError

    try:
        return PreflightRequest.model_validate(dict(fields))
    except ValidationError as exc:
        loc, message, value = first_error(exc)
        raise ConfigError(loc or "request", value, message) from None
