"""Per-request state of linear-attention and Mamba layers, from vLLM 0.33.0's shapes.

A state layer's cache is a conv state (the last ``kernel - 1`` inputs of its short convolution,
plus one per speculative token) and a recurrent state, per request and layer, whatever the
request's length (``vllm/model_executor/layers/mamba/mamba_utils.py`` MambaStateShapeCalculator
and MambaStateDtypeCalculator; each model's get_mamba_state_shape_from_config names the fields):

==================  ===============================================  ==========================
kind                conv state (elements)                            recurrent state (elements)
==================  ===============================================  ==========================
gated_delta_net     (k_dim x k_heads x 2 + v_dim x v_heads) / tp     v_heads / tp x v_dim x k_dim
kda                 (heads x head_dim x 3) / tp                      heads / tp x head_dim ^ 2
mamba2              (intermediate + 2 x groups' x state) / tp        heads / tp x head_dim x state
==================  ===============================================  ==========================

times ``kernel - 1 + num_speculative_tokens`` rows for the conv state. The conv state is in the
model's dtype (--mamba-cache-dtype auto); the recurrent state in --mamba-ssm-cache-dtype: auto is
the conv state's dtype, except KDA (float32) and Nemotron-H (the config's mamba_ssm_cache_dtype,
else float32).

In ``align`` mode (prefix caching on, vLLM's default) a request also keeps the state at its
last block boundary and, where the prefill kernel exports one (Mamba2; FlashInfer's GDN
prefill, on a 64-token grid), a checkpoint state. The chunked prefill kernels' own workspaces
(FLA's chunk_gated_delta_rule, Mamba2's chunked scan) are activations, not sized here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memest.errors import ConfigError
from memest.estimate.layer_kinds import LayerKind

#: vLLM 0.33.0's FlashInfer GDN prefill checkpoints land on this token grid (gdn_attn.py).
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64
FLOAT32_BYTES = 4


@dataclass(frozen=True, slots=True)
class StateShape:
    """One layer's per-request state: conv and recurrent elements and their bytes each."""

    conv_rows: int
    conv_dim: int
    recurrent: tuple[int, ...]
    conv_dtype_bytes: int
    recurrent_dtype_bytes: int

    @property
    def conv_bytes(self) -> int:
        return self.conv_rows * self.conv_dim * self.conv_dtype_bytes

    @property
    def recurrent_bytes(self) -> int:
        n = 1
        for d in self.recurrent:
            n *= d
        return n * self.recurrent_dtype_bytes

    @property
    def bytes(self) -> int:
        """MambaSpec.real_page_size_bytes: one state of one layer."""
        return self.conv_bytes + self.recurrent_bytes


def _get(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"model_config.{key}", value, "expected an integer >= 1")
    return value


def _divide(n: int, tp: int, field: str) -> int:
    if n % tp:
        raise ConfigError(field, n, f"not divisible by tensor_parallel_size={tp}")
    return n // tp


def _ssm_bytes(cfg: Mapping[str, Any], kind: LayerKind, dtype_bytes: int) -> int:
    if kind == "kda":
        return FLOAT32_BYTES
    if cfg.get("model_type") == "nemotron_h":
        name = cfg.get("mamba_ssm_cache_dtype", "float32")
        return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(name), 4)
    return dtype_bytes


def state_shape(
    cfg: Mapping[str, Any], kind: LayerKind, *, tp: int, dtype_bytes: int, spec_tokens: int = 0
) -> StateShape:
    """The per-request state of one ``kind`` layer of ``cfg`` on one rank.

    Raises:
        ConfigError: a field the kind needs is missing, or does not split over ``tp``.
    """
    ssm = _ssm_bytes(cfg, kind, dtype_bytes)
    if kind == "gated_delta_net":
        kh, vh = _get(cfg, "linear_num_key_heads"), _get(cfg, "linear_num_value_heads")
        kd, vd = _get(cfg, "linear_key_head_dim"), _get(cfg, "linear_value_head_dim")
        conv = _divide(kd * kh * 2 + vd * vh, tp, "model_config.linear_num_value_heads")
        rows = _get(cfg, "linear_conv_kernel_dim") - 1 + spec_tokens
        rec = (_divide(vh, tp, "model_config.linear_num_value_heads"), vd, kd)
        return StateShape(rows, conv, rec, dtype_bytes, ssm)
    if kind == "kda":
        lin = cfg.get("linear_attn_config") or {}
        heads, hd = _get(lin, "num_heads"), _get(lin, "head_dim")
        conv = _divide(heads * hd * 3, tp, "model_config.linear_attn_config.num_heads")
        rows = _get(lin, "short_conv_kernel_size") - 1 + spec_tokens
        return StateShape(rows, conv, (heads // tp, hd, hd), dtype_bytes, ssm)
    if kind == "mamba2":
        return _mamba2(cfg, tp=tp, dtype_bytes=dtype_bytes, ssm=ssm, spec_tokens=spec_tokens)
    raise ConfigError("layer_kind", kind, "has no per-request state")


def _mamba2(
    cfg: Mapping[str, Any], *, tp: int, dtype_bytes: int, ssm: int, spec_tokens: int
) -> StateShape:
    if cfg.get("model_type") == "nemotron_h":
        heads, hd = _get(cfg, "mamba_num_heads"), _get(cfg, "mamba_head_dim")
        groups, state = _get(cfg, "n_groups"), _get(cfg, "ssm_state_size")
        kernel, inter = _get(cfg, "conv_kernel"), heads * hd
    else:  # Granite 4 (GraniteMoeHybrid)
        heads, hd = _get(cfg, "mamba_n_heads"), _get(cfg, "mamba_d_head")
        groups, state = _get(cfg, "mamba_n_groups"), _get(cfg, "mamba_d_state")
        kernel, inter = (
            _get(cfg, "mamba_d_conv"),
            _get(cfg, "mamba_expand") * _get(cfg, "hidden_size"),
        )
    groups = mamba2_groups(groups, tp)
    conv = _divide(inter + 2 * groups * state, tp, "model_config.n_groups")
    rec = (_divide(heads, tp, "model_config.mamba_num_heads"), hd, state)
    return StateShape(kernel - 1 + spec_tokens, conv, rec, dtype_bytes, ssm)


def mamba2_groups(groups: int, tp: int) -> int:
    """Mamba2's B/C groups over all ranks: groups that a rank's heads need are replicated when
    they do not split over tp (MambaStateShapeCalculator.extra_groups_for_head_shards)."""
    return groups if groups % tp == 0 else groups + tp - groups


def state_blocks(
    kind: LayerKind, *, align: bool, spec_tokens: int = 0, flashinfer_gdn: bool = True
) -> int:
    """States one request holds of a ``kind`` layer (MambaSpec.max_memory_usage_bytes / page):
    one, plus one per speculative token; in align mode one more for the last block boundary
    and a prefill checkpoint where the layer exports one (Mamba2, FlashInfer's GDN)."""
    if not align:
        return 1 + spec_tokens
    checkpoint = kind == "mamba2" or (kind == "gated_delta_net" and flashinfer_gdn)
    return 2 + spec_tokens + int(checkpoint)


def checkpoint_alignment(kinds: set[LayerKind], *, flashinfer_gdn: bool = True) -> int:
    """The token grid align mode keeps blocks on (get_mamba_prefill_checkpoint_alignment): the
    lcm of the state layers' checkpoint alignments, 1 when one layer exports none."""
    states = kinds & {"gated_delta_net", "kda", "mamba2"}
    if states == {"gated_delta_net"} and flashinfer_gdn:
        return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    return 1
