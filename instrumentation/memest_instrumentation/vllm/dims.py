"""The model's (and the drafter's) dimensions from the Hugging Face config vLLM loaded.

Recorded in the report's ``config.model_dims`` / ``config.drafter_dims`` so that a what-if on
the report needs no ``--model-config`` (memest.estimate.runner_buffers.ModelDims).
"""

from __future__ import annotations

from typing import Any

from memest.schema import ModelShape

#: ModelShape fields read from the config under the same name (hidden_size, vocab_size, dtype,
#: model_type and mlp_only_layers are read apart): what memest.estimate.model_shape reads.
_OPTIONAL_INTS = (
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "draft_vocab_size",
    "target_hidden_size",
    "num_aux_hidden_states",
    "num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
    "max_position_embeddings",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
)


def _positive(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def model_shape(model_config: Any) -> ModelShape | None:
    """The dimensions of a vLLM ``ModelConfig`` (its ``hf_text_config``); None without one.

    The dtype is the one vLLM loads the weights in (``model_config.dtype``), which may differ
    from the checkpoint's ``torch_dtype``.
    """
    if model_config is None:
        return None
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    if hf is None:
        return None
    hidden = _positive(getattr(hf, "hidden_size", None))
    vocab = _positive(getattr(hf, "vocab_size", None))
    if not hidden or not vocab:
        return None
    fields: dict[str, Any] = {"hidden_size": hidden, "vocab_size": vocab}
    for name in _OPTIONAL_INTS:
        value = _positive(getattr(hf, name, None))
        if value:
            fields[name] = value
    layers = getattr(hf, "num_hidden_layers", None)
    if _positive(layers) is not None:
        fields["num_hidden_layers"] = layers
    dtype = getattr(model_config, "dtype", None) or getattr(hf, "torch_dtype", None)
    if dtype is not None:
        fields["dtype"] = str(dtype).removeprefix("torch.")
    arch = getattr(hf, "architectures", None) or []
    fields["architectures"] = [str(a) for a in arch]
    model_type = getattr(hf, "model_type", None)
    if isinstance(model_type, str) and model_type:
        fields["model_type"] = model_type
    only = getattr(hf, "mlp_only_layers", None)
    if isinstance(only, (list, tuple)) and all(_positive(i) is not None for i in only):
        fields["mlp_only_layers"] = [int(i) for i in only]
    tie = getattr(hf, "tie_word_embeddings", None)
    if isinstance(tie, bool):
        fields["tie_word_embeddings"] = tie
    types = getattr(hf, "layer_types", None)
    if isinstance(types, (list, tuple)) and all(isinstance(t, str) for t in types):
        fields["layer_types"] = list(types)
    return ModelShape(**fields)


def record(vllm_config: Any) -> None:
    """Add the target's and the drafter's dimensions to the configuration read so far."""
    from memest_instrumentation.vllm.state import state

    st = state()
    if st.config is None:
        return
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    st.config = st.config.model_copy(
        update={
            "model_dims": model_shape(getattr(vllm_config, "model_config", None)),
            "drafter_dims": model_shape(draft),
        }
    )


def record_gdn_prefill(vllm_config: Any) -> None:
    """The gated-delta-net prefill backend vLLM built (``gdn_prefill_backend`` of a GDN layer
    in the model's forward context), once the model exists: memest.estimate.linear_prefill
    sizes the prefill's allocations by it."""
    from memest_instrumentation.vllm.state import state

    st = state()
    dims = st.config.model_dims if st.config is not None else None
    if st.config is None or dims is None or not dims.linear_num_value_heads:
        return
    compilation = getattr(vllm_config, "compilation_config", None)
    layers = getattr(compilation, "static_forward_context", None) or {}
    for layer in layers.values():
        backend = getattr(layer, "gdn_prefill_backend", None)
        if isinstance(backend, str) and backend:
            st.config = st.config.model_copy(update={"gdn_prefill_backend": backend})
            return


def record_mla_prefill(vllm_config: Any) -> None:
    """The MLA prefill backend vLLM built (its name, whether it pads v) and its attention
    (decode) backend, once the model exists.

    memest.estimate.mla_context sizes the reservation of MLA's prefill over cached context by
    the first, memest.estimate.terms.mla_decode TRITON_MLA's decode logits by the second; any
    MLA layer of the model's forward context holds both.
    """
    from memest_instrumentation.vllm.state import state

    st = state()
    dims = st.config.model_dims if st.config is not None else None
    if st.config is None or dims is None or not dims.kv_lora_rank:
        return
    compilation = getattr(vllm_config, "compilation_config", None)
    layers = getattr(compilation, "static_forward_context", None) or {}
    for layer in layers.values():
        backend = getattr(layer, "prefill_backend", None)
        if backend is None:
            continue
        get_name = getattr(backend, "get_name", None)
        name = str(get_name()) if callable(get_name) else type(backend).__name__
        padded = bool(getattr(backend, "requires_v_padding", False))
        decode = getattr(getattr(layer, "attn_backend", None), "get_name", None)
        st.config = st.config.model_copy(
            update={
                "mla_prefill_backend": name,
                "mla_prefill_v_padded": padded,
                "mla_decode_backend": str(decode()) if callable(decode) else None,
            }
        )
        return
