"""What a gated-delta-net layer's prefill allocates in a serving step, from vLLM 0.33.0's code
(the same in 0.34.0).

vLLM's profile run pushes its tokens through the model with ``skip_attn=True``: the layer's
``_forward_core`` (``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``) sees no attention
metadata and returns before its recurrence, so no start's measured headroom holds what the
recurrence allocates. A serving step with N prefilling requests does, per layer, in order:

- ``fused_post_conv_prep``: q and k (tokens x key heads x key dim), v (tokens x value heads x
  value dim) in the model's dtype, g and beta (tokens x value heads, float32);
- ``initial_state = ssm_state[prefill_state_indices]``: the N requests' recurrent states
  gathered (N x value heads x value dim x key dim, in the state's dtype);
- the chunked recurrence, by backend:

  - ``triton`` (FLA, ``third_party/flash_linear_attention/ops/chunk.py``): g's chunk-local
    cumsum (float32), A = chunk_scaled_dot_kkt (tokens x heads x 64, float32), solve_tril's
    inverse in the model's dtype (the float32 A freed), w and u, then
    ``chunk_gated_delta_rule_fwd_h``'s h (one state per 64-token chunk of every request, in
    the model's dtype), the final states (N states, float32) and v_new, then o; w, u, h and
    v_new are freed on return, g's cumsum and A with the function;
  - ``flashinfer`` (``fi_chunk_gated_delta_rule``, vLLM's choice on SM90): the states copied
    to float32, g and beta to float32 and g's exp, then FlashInfer's output and float32 final
    states (FlashInfer's own scratch inside the kernel call is not derived here);

- ``ssm_state[...] = last_recurrent_state.to(ssm_state.dtype)``: a cast of the final states
  (none when the state is float32).

Most of it is freed before the next layer, whose identical requests reuse the cached blocks:
one layer's sequence is the term. Per-token tensors of a few MiB fit blocks the profile
pass's forward left free; the per-request states (a 64-request batch of Qwen3-Next-class
layers: 64 MiB gathered, 128 MiB of float32 final states) reserve segments of their own, which
is what a full batch of short prompts adds over the first full-size step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memest.errors import ConfigError
from memest.estimate.layer_kinds import layer_kinds

#: Tokens per chunk of FLA's chunked kernels (``third_party/flash_linear_attention/ops/utils.py``
#: FLA_CHUNK_SIZE).
FLA_CHUNK_TOKENS = 64
FLOAT32_BYTES = 4
GdnPrefillBackend = Literal["flashinfer", "triton"]
#: vLLM's GDN prefill backends memest derives (``_resolve_gdn_prefill_backend``'s CUDA ones).
GDN_PREFILL_BACKENDS: tuple[GdnPrefillBackend, ...] = ("flashinfer", "triton")
#: What vLLM resolves ``auto`` to on an SM90 GPU (FlashInfer's GDN prefill, Hopper).
DEFAULT_GDN_PREFILL_BACKEND: GdnPrefillBackend = "flashinfer"


def prefill_backend(name: str | None) -> GdnPrefillBackend:
    """The derivation for vLLM's recorded backend: FLA's for ``triton``; any other (FlashInfer,
    and backends memest has not derived, e.g. cutedsl) gets FlashInfer's, which holds the
    allocations vLLM's own code makes around the kernel."""
    return "triton" if name == "triton" else DEFAULT_GDN_PREFILL_BACKEND


#: One allocator event: ("alloc", handle, bytes) or ("free", handle, 0).
Event = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class GdnLayer:
    """One rank's gated-delta-net layer: heads and head dims, and the dtypes' bytes."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    dtype_bytes: int  # the model's activations
    state_dtype_bytes: int  # the recurrent state (--mamba-ssm-cache-dtype; auto: the model's)

    @property
    def state_bytes(self) -> int:
        """One request's recurrent state in the cache's dtype."""
        return self.value_heads * self.value_dim * self.key_dim * self.state_dtype_bytes

    @property
    def state_elements(self) -> int:
        return self.value_heads * self.value_dim * self.key_dim

    @property
    def token_width(self) -> int:
        """Elements per token the layer's forward holds outside its recurrence
        (GatedDeltaNetAttention.forward_cuda): in_proj_qkvz's output (q, k, v, z), in_proj_ba's
        (b, a), mixed_qkv (q, k, v made contiguous), z and core_attn_out (value heads x dim
        each). The profile run makes these requests too: only the recurrence is skipped."""
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        return (2 * keys + 2 * values) + 2 * self.value_heads + (2 * keys + values) + 2 * values


def gdn_layer(cfg: Mapping[str, Any], *, tp: int, dtype_bytes: int) -> GdnLayer | None:
    """The gated-delta-net layer of ``cfg`` on one rank, None when it has none.

    Raises:
        ConfigError: a head count does not split over ``tp``.
    """
    if cfg.get("linear_num_value_heads") is None:
        return None
    try:
        kinds = layer_kinds(cfg)
    except ConfigError:
        return None
    if "gated_delta_net" not in kinds:
        return None
    from memest.estimate.linear_attention import state_shape

    shape = state_shape(cfg, "gated_delta_net", tp=tp, dtype_bytes=dtype_bytes)
    value_heads, value_dim, key_dim = shape.recurrent
    key_heads = int(cfg["linear_num_key_heads"])
    if key_heads % tp:
        raise ConfigError(
            "model_config.linear_num_key_heads", key_heads, f"not divisible by tp={tp}"
        )
    return GdnLayer(
        key_heads=key_heads // tp,
        value_heads=value_heads,
        key_dim=key_dim,
        value_dim=value_dim,
        dtype_bytes=dtype_bytes,
        state_dtype_bytes=shape.recurrent_dtype_bytes,
    )


def fla_chunks(requests: int, tokens: int) -> int:
    """The most 64-token chunks ``requests`` prefills of ``tokens`` tokens in all can make (each
    request one chunk at least, the rest in whole chunks)."""
    if requests <= 0 or tokens <= 0:
        return 0
    requests = min(requests, tokens)
    return requests + (tokens - requests) // FLA_CHUNK_TOKENS


def prefill_events(
    layer: GdnLayer, tokens: int, requests: int, backend: GdnPrefillBackend
) -> list[Event]:
    """One layer's prefill of ``requests`` requests and ``tokens`` tokens, as allocator events
    in vLLM's order (handles are local to the list)."""
    if backend not in GDN_PREFILL_BACKENDS:
        raise ConfigError("gdn_prefill_backend", backend, f"expected one of {GDN_PREFILL_BACKENDS}")
    if tokens <= 0 or requests <= 0:
        return []
    b, v_heads = layer.dtype_bytes, layer.value_heads
    key_row = tokens * layer.key_heads * layer.key_dim * b
    value_row = tokens * v_heads * layer.value_dim * b
    per_head = tokens * v_heads * FLOAT32_BYTES
    states = requests * layer.state_elements
    events: list[Event] = []
    handles = iter(range(1 << 20))

    def alloc(size: int) -> int:
        h = next(handles)
        events.append(("alloc", h, size))
        return h

    def free(*hs: int) -> None:
        events.extend(("free", h, 0) for h in hs)

    inputs = [alloc(key_row), alloc(key_row), alloc(value_row), alloc(per_head), alloc(per_head)]
    gathered = alloc(states * layer.state_dtype_bytes)
    if backend == "triton":
        g_cum = alloc(per_head)
        a_fp32 = alloc(tokens * v_heads * FLA_CHUNK_TOKENS * FLOAT32_BYTES)
        a_inv = alloc(tokens * v_heads * FLA_CHUNK_TOKENS * b)
        free(a_fp32)
        w, u = alloc(tokens * v_heads * layer.key_dim * b), alloc(value_row)
        h = alloc(fla_chunks(requests, tokens) * layer.state_elements * b)
        final = alloc(states * FLOAT32_BYTES)
        v_new = alloc(value_row)
        out = alloc(value_row)
        free(w, u, h, v_new, g_cum, a_inv)
    else:
        copies = [alloc(states * FLOAT32_BYTES)] if layer.state_dtype_bytes != FLOAT32_BYTES else []
        copies += [alloc(per_head), alloc(per_head), alloc(per_head)]  # g, beta to float32; exp(g)
        out = alloc(value_row)
        final = alloc(states * FLOAT32_BYTES)
        free(*copies)
    if layer.state_dtype_bytes != FLOAT32_BYTES:
        cast = alloc(states * layer.state_dtype_bytes)
        free(cast)
    free(final, out, gathered, *inputs)
    return events
