"""vLLM is the oracle for a hybrid model's KV-cache groups, block count, tokens and concurrency.

For each hybrid config under tests/data/configs (and the lab's H200 shapes) vLLM's own code runs
on this CPU machine: the platform's hybrid block-size alignment
(``Platform._align_hybrid_block_size``), the model class's Mamba state shapes and dtypes, vLLM's
KV-cache spec classes (FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec, MambaSpec),
``get_kv_cache_groups``, ``get_kv_cache_config_from_groups`` and ``get_kv_cache_capacity``, each
given a stand-in VllmConfig with the fields they read. Each layer's kind comes from transformers'
config class (the ``layer_types`` vLLM's models read) or the field vLLM's model reads
(Nemotron-H's pattern, Kimi-Linear's ``kda_layers``, gpt-oss's even layers). memest's
pre-flight must give the same groups, the same block count and vLLM's logged tokens and
concurrency. Written against vLLM 0.33.0's and 0.34.0's module layout.
"""

from __future__ import annotations

import contextlib
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memest.estimate import kv_groups
from memest.preflight import hybrid, predict
from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
LAB = ROOT / "lab" / "models"

#: config -> architecture, transformers' config class for layer_types (None: vLLM's model reads
#: another field)
MODELS = {
    "gemma3_6l": ("Gemma3ForCausalLM", "Gemma3TextConfig"),
    "gemma3_12l": ("Gemma3ForCausalLM", "Gemma3TextConfig"),
    "gpt_oss_6l": ("GptOssForCausalLM", None),
    "mistral_sliding_4l": ("MistralForCausalLM", None),
    "qwen3next_a3b_4l": ("Qwen3NextForCausalLM", "Qwen3NextConfig"),
    "qwen3next_8l": ("Qwen3NextForCausalLM", "Qwen3NextConfig"),
    "kimi_linear_4l": ("KimiLinearForCausalLM", None),
    "nemotron_h_8l": ("NemotronHForCausalLM", None),
    "granite4_8l": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig"),
}
#: (max_model_len, max_num_batched_tokens, KV bytes available)
GRIDS = [(4096, 4096, 122_692_331_008), (32768, 2048, 40 << 30), (131072, 8192, 100 << 30)]
GiB = 1 << 30


def _cfg(name: str) -> dict[str, Any]:
    path = LAB / name / "config.json" if (LAB / name).is_dir() else CONFIGS / f"{name}.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def vllm() -> Iterator[types.SimpleNamespace]:
    try:
        import torch
        import transformers
        from vllm.v1.core import kv_cache_planning as planning
        from vllm.v1.core import kv_cache_utils as utils
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            MambaSpec,
            MLAAttentionSpec,
            SlidingWindowSpec,
        )
    except ImportError:
        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM is not installed")
        raise
    yield types.SimpleNamespace(
        torch=torch,
        transformers=transformers,
        planning=planning,
        utils=utils,
        Full=FullAttentionSpec,
        Sliding=SlidingWindowSpec,
        MLA=MLAAttentionSpec,
        Mamba=MambaSpec,
    )


def _vllm_kinds(v: types.SimpleNamespace, name: str, cfg: dict[str, Any]) -> list[str]:
    """Each layer's kind as vLLM's model code reads it."""
    arch, config_cls = MODELS[name]
    n = cfg.get("num_hidden_layers", 0)
    if config_cls is not None:
        fields = {k: val for k, val in cfg.items() if k not in ("architectures",)}
        types_ = getattr(v.transformers, config_cls)(**fields).layer_types
        table = {
            "sliding_attention": "sliding",
            "full_attention": "full",
            "attention": "full",
            "linear_attention": "state",
            "mamba": "state",
        }
        return [table[t] for t in types_]
    if arch == "GptOssForCausalLM":  # gpt_oss.py: sliding on every other layer
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    if arch == "MistralForCausalLM":  # arg_utils: CacheConfig.sliding_window on every layer
        return ["sliding"] * n
    if arch == "KimiLinearForCausalLM":
        from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

        kimi = KimiLinearConfig(**{k: val for k, val in cfg.items() if k != "architectures"})
        return ["state" if kimi.is_kda_layer(i) else "mla" for i in range(n)]
    pattern = cfg["hybrid_override_pattern"]  # nemotron_h.py: one character per layer
    return [{"M": "state", "*": "full"}.get(c, "none") for c in pattern]


def _stand_in(
    v: types.SimpleNamespace, cfg: dict[str, Any], arch: str, grid: tuple[int, ...], mla: bool
) -> types.SimpleNamespace:
    """The VllmConfig fields vLLM's sizing code reads."""
    mml, mnbt, _ = grid
    hf = types.SimpleNamespace(**cfg)
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    mc = types.SimpleNamespace(
        use_mla=mla,
        dtype=v.torch.bfloat16,
        architecture=arch,
        model_impl="vllm",
        convert_type="none",
        runner_type="generate",
        hf_config=hf,
        hf_text_config=hf,
        max_model_len=mml,
        get_num_kv_heads=lambda pc: 1 if mla else cfg["num_key_value_heads"],
        get_head_size=lambda: cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] if mla else head,
    )
    cc = types.SimpleNamespace(
        cache_dtype="auto",
        block_size=16,
        mamba_cache_mode="align",
        mamba_page_size_padded=None,
        mamba_block_size=16,
        mamba_cache_dtype="auto",
        mamba_ssm_cache_dtype="auto",
        kv_cache_dtype_skip_layers=[],
        use_replayssm=False,
        use_flashinfer_replayssm=False,
        num_gpu_blocks_override=None,
        kv_cache_layout="LBNHC",
        prefix_cache_retention_interval=None,
        get_resolved_kv_cache_layout=_layout,
    )
    return types.SimpleNamespace(
        model_config=mc,
        cache_config=cc,
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1, pipeline_parallel_size=1
        ),
        scheduler_config=types.SimpleNamespace(
            disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=mnbt
        ),
        attention_config=types.SimpleNamespace(hisparse_config=None),
        device_config=types.SimpleNamespace(device_type="cuda"),
        speculative_config=None,
        num_speculative_tokens=0,
        use_flashinfer_replayssm=False,
        max_in_flight_tokens=2 * mnbt,  # async scheduling: two batches in flight
    )


def _layout() -> Any:
    from vllm.v1.kv_cache_layout import KVCacheLayout

    return KVCacheLayout.LBNHC


def _align_block(
    v: types.SimpleNamespace,
    vc: types.SimpleNamespace,
    kinds: list[str],
    arch: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's platform alignment of the attention block to the Mamba state (FLASH_ATTN)."""
    import vllm.config.vllm as config_vllm
    import vllm.model_executor.layers.mamba.abstract as abstract
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT

    # the layers' declared checkpoint alignment: FlashInfer's GDN prefill declares its grid,
    # Mamba2 and KDA none (MambaBase.get_prefill_checkpoint_alignment)
    gdn = arch == "Qwen3NextForCausalLM"
    alignment = FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if gdn else None
    monkeypatch.setattr(abstract, "get_mamba_prefill_checkpoint_alignment", lambda c: alignment)
    monkeypatch.setattr(config_vllm, "set_current_vllm_config", lambda c: contextlib.nullcontext())
    monkeypatch.setattr(
        Platform, "_find_non_ssm_backends", classmethod(lambda cls, c: [FlashAttentionBackend])
    )
    if arch == "NemotronHForCausalLM":
        from vllm.model_executor.models.config import NemotronHForCausalLMConfig

        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
            cache_config=vc.cache_config, hf_config=vc.model_config.hf_config
        )
    if "state" in kinds:
        Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
        vc.cache_config.mamba_block_size = vc.cache_config.block_size


def _vllm_specs(
    v: types.SimpleNamespace,
    vc: types.SimpleNamespace,
    kinds: list[str],
    arch: str,
    cfg: dict[str, Any],
) -> dict[str, Any]:
    from vllm.model_executor.models import ModelRegistry

    cc, mc, bf16 = vc.cache_config, vc.model_config, v.torch.bfloat16
    block = cc.block_size
    attn = {
        "block_size": block,
        "num_kv_heads": mc.get_num_kv_heads(None),
        "head_size": mc.get_head_size(),
        "dtype": bf16,
    }
    specs: dict[str, Any] = {}
    state = None
    if "state" in kinds:
        model_cls, _ = ModelRegistry.resolve_model_cls(arch, model_config=mc)
        state = {
            "shapes": tuple(model_cls.get_mamba_state_shape_from_config(vc)),
            "dtypes": tuple(model_cls.get_mamba_state_dtype_from_config(vc)),
        }
    for i, kind in enumerate(kinds):
        name = f"layers.{i}"
        if kind == "full":
            specs[name] = v.Full(**attn)
        elif kind == "sliding":
            specs[name] = v.Sliding(**attn, sliding_window=cfg["sliding_window"])
        elif kind == "mla":
            specs[name] = v.MLA(**attn, cache_dtype_str="auto")
        elif kind == "state":
            assert state is not None
            checkpoint = 0 if arch == "KimiLinearForCausalLM" else 1  # KDA exports none
            specs[name] = v.Mamba(
                **state,
                block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_cache_mode="align",
                num_prefill_checkpoint_blocks=checkpoint,
            )
    return specs


def _memest(name: str, cfg: dict[str, Any], grid: tuple[int, ...]) -> Any:
    mml, mnbt, _ = grid
    fields = {
        "model_config_json": cfg,
        "gpu": "h200",
        "max_model_len": mml,
        "max_num_batched_tokens": mnbt,
        "max_num_seqs": 128,
    }
    s = predict.setup(predict.request_from(fields))
    return hybrid.kv_spec(cfg, s, predict.kv_spec(s))


CASES = [(name, grid) for name in MODELS for grid in GRIDS]


@pytest.mark.parametrize(("name", "grid"), CASES, ids=[f"{n}-{g[0]}" for n, g in CASES])
def test_groups_blocks_tokens_are_vllms(
    vllm: types.SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    grid: tuple[int, int, int],
) -> None:
    v = vllm
    cfg = _cfg(name)
    grid = (min(grid[0], cfg["max_position_embeddings"]), *grid[1:])
    arch = MODELS[name][0]
    kinds = _vllm_kinds(v, name, cfg)
    vc = _stand_in(v, cfg, arch, grid, mla="mla" in kinds)
    _align_block(v, vc, kinds, arch, monkeypatch)
    specs = _vllm_specs(v, vc, kinds, arch, cfg)
    groups = v.planning.get_kv_cache_groups(vc, specs)
    config = v.planning.get_kv_cache_config_from_groups(vc, groups, grid[2])
    tokens, concurrency = v.utils.get_kv_cache_capacity(vc, config)

    spec = _memest(name, cfg, grid)
    lengths = kv_groups.Lengths(grid[0], grid[1])
    got = [(g.kind, g.num_layers, g.block_size, g.page_size_bytes) for g in spec.groups]
    want = [
        (
            _kind(g.kv_cache_spec),
            len(g.layer_names),
            g.kv_cache_spec.block_size,
            g.kv_cache_spec.page_size_bytes,
        )
        for g in groups
    ]
    assert got == want
    assert kv_groups.num_blocks(spec, grid[2]) == config.num_blocks
    assert kv_groups.kv_tokens(spec, grid[2], lengths) == tokens
    assert kv_groups.max_concurrency(spec, grid[2], lengths) == pytest.approx(concurrency)


def _kind(spec: Any) -> str:
    name = type(spec).__name__
    return {
        "FullAttentionSpec": "full_attention",
        "SlidingWindowSpec": "sliding_window",
        "MLAAttentionSpec": "mla",
        "MambaSpec": "mamba",
    }[name]


@pytest.mark.parametrize("name", ["gemma3_12l", "qwen3next_8l", "kimi_linear_4l", "granite4_8l"])
def test_the_plugin_records_vllms_groups(
    vllm: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The plugin's groups, read from vLLM's own KVCacheConfig, give vLLM's capacity."""
    from memest_instrumentation.vllm import collect

    v, cfg, grid = vllm, _cfg(name), GRIDS[1]
    arch = MODELS[name][0]
    kinds = _vllm_kinds(v, name, cfg)
    vc = _stand_in(v, cfg, arch, grid, mla="mla" in kinds)
    _align_block(v, vc, kinds, arch, monkeypatch)
    specs = _vllm_specs(v, vc, kinds, arch, cfg)
    config = v.planning.get_kv_cache_config_from_groups(
        vc, v.planning.get_kv_cache_groups(vc, specs), grid[2]
    )
    tokens, concurrency = v.utils.get_kv_cache_capacity(vc, config)
    groups = collect.kv_groups(types.SimpleNamespace(vllm_config=vc), config)
    spec = kv_groups.hybrid_spec(
        predict.kv_spec(
            predict.setup(predict.request_from({"model_config_json": cfg, "gpu": "h200"}))
        ),
        groups,
    )
    lengths = kv_groups.Lengths(grid[0], grid[1])
    assert spec.groups == _memest(name, cfg, grid).groups
    assert kv_groups.num_blocks(spec, grid[2]) == config.num_blocks
    assert kv_groups.kv_tokens(spec, grid[2], lengths) == tokens
    assert kv_groups.max_concurrency(spec, grid[2], lengths) == pytest.approx(concurrency)
