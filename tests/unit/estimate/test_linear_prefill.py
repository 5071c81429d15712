"""A gated-delta-net layer's prefill in a serving step: the allocations vLLM's code makes, by
hand from the layer's shapes, and the reserve they add to a full batch of prefills, held to the
H200 Qwen3-Next-class start that measured it."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate.activation import activation_shape
from memest.estimate.linear_prefill import (
    FLA_CHUNK_TOKENS,
    fla_chunks,
    gdn_layer,
    prefill_backend,
    prefill_events,
)
from memest.estimate.model_shape import model_shape
from memest.estimate.sampler import serving_step_reserve_bytes

ROOT = Path(__file__).resolve().parents[3]
QWEN3_NEXT = json.loads((ROOT / "tests/data/configs/qwen3next_8l.json").read_text())
MiB = 1 << 20
#: One request's recurrent state of a Qwen3-Next-class layer: 32 value heads x 128 x 128.
STATE = 32 * 128 * 128


def _sizes(events: list[tuple[str, int, int]]) -> list[int]:
    return [size for action, _, size in events if action == "alloc"]


def test_the_layer_is_read_from_config_json_per_rank() -> None:
    layer = gdn_layer(QWEN3_NEXT, tp=2, dtype_bytes=2)
    assert layer is not None
    assert (layer.key_heads, layer.value_heads, layer.key_dim, layer.value_dim) == (8, 16, 128, 128)
    assert layer.state_bytes == 16 * 128 * 128 * 2
    llama = json.loads((ROOT / "tests/data/configs/llama8b.json").read_text())
    assert gdn_layer(llama, tp=1, dtype_bytes=2) is None
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        gdn_layer(QWEN3_NEXT, tp=32, dtype_bytes=2)  # 16 key heads over 32 ranks


def test_chunks_are_one_per_request_then_whole_chunks_of_the_rest() -> None:
    assert fla_chunks(1, 2047) == 32  # ceil(2047 / 64)
    # 64 prompts of 16 tokens make 64 chunks; the most 1,024 tokens of 64 prompts can make is
    # 63 one-token prompts beside one of 961 tokens (16 chunks)
    assert fla_chunks(64, 1024) == 63 + 16 == 79
    assert fla_chunks(64, 2048) == 64 + (2048 - 64) // 64 == 95  # 63 one-token prompts + 32
    assert fla_chunks(4096, 2048) == 2048  # never more requests than tokens


def test_the_fla_sequence_holds_the_states_vllm_allocates() -> None:
    layer = gdn_layer(QWEN3_NEXT, tp=1, dtype_bytes=2)
    assert layer is not None
    sizes = _sizes(prefill_events(layer, 1024, 64, "triton"))
    # q, k: 1,024 x 16 x 128 bf16; v: 1,024 x 32 x 128 bf16; g, beta: 1,024 x 32 float32
    assert sizes[:5] == [4 * MiB, 4 * MiB, 8 * MiB, 128 * 1024, 128 * 1024]
    assert sizes[5] == 64 * STATE * 2  # ssm_state[prefill_state_indices]: 64 bf16 states
    # h: one bf16 state per chunk (at most 79 chunks, above); the final states in float32; the
    # cast back to bf16
    assert 79 * STATE * 2 in sizes[6:] and 64 * STATE * 4 in sizes[6:]
    assert sizes[-1] == 64 * STATE * 2
    assert sizes[7] == 1024 * 32 * FLA_CHUNK_TOKENS * 4  # chunk_scaled_dot_kkt's float32 A


def test_flashinfer_copies_the_states_to_float32_and_keeps_no_chunk_states() -> None:
    layer = gdn_layer(QWEN3_NEXT, tp=1, dtype_bytes=2)
    assert layer is not None
    sizes = _sizes(prefill_events(layer, 1024, 64, "flashinfer"))
    assert sizes.count(64 * STATE * 4) == 2  # fi_state and FlashInfer's final states
    assert sizes.count(64 * STATE * 2) == 2  # the gather and the cast back
    assert prefill_backend("triton") == "triton"
    assert prefill_backend(None) == prefill_backend("cutedsl") == "flashinfer"
    with pytest.raises(ConfigError, match="gdn_prefill_backend"):
        prefill_events(layer, 1024, 64, "sycl")  # type: ignore[arg-type]


def test_a_full_batch_of_prefills_reserves_the_states_the_h200_start_needed() -> None:
    # H200 call 50 (reports/vllm/README.md "Calls 48-50"), the Qwen3-Next-class lab model at
    # 64 seqs / 2,048 tokens, FLA prefill (the carry lacks FlashInfer): memest apply sized its
    # budget with the prompt-logprobs chunk but no GDN prefill, and serving's full-batch step
    # (64 prompts) went 228,868,096 B past it. The step replayed here is serving's widest (64
    # prefills over 2,048 tokens): it must cover that, and stay within the 0.1 GiB target.
    measured_short = 228_868_096
    shape = activation_shape(model_shape(QWEN3_NEXT))
    without = dataclasses.replace(shape, gdn=None)
    added = serving_step_reserve_bytes(shape, 64, 2048, "triton") - serving_step_reserve_bytes(
        without, 64, 2048, "triton"
    )
    assert measured_short <= added <= measured_short + (1 << 30) // 10
    # at 64 states of bf16 and float32 each, the states alone are 192 MiB
    assert added >= 64 * STATE * (2 + 4)


@pytest.mark.vllm
def test_the_sequence_is_vllms_own() -> None:
    utils = pytest.importorskip("vllm.third_party.flash_linear_attention.ops.utils")
    assert utils.FLA_CHUNK_SIZE == FLA_CHUNK_TOKENS
    delta_h = pytest.importorskip("vllm.third_party.flash_linear_attention.ops.chunk_delta_h")
    source = inspect.getsource(delta_h.chunk_gated_delta_rule_fwd_h)
    assert "h = k.new_empty(B, NT, H, V, K)" in source
    assert "k.new_empty(N, H, V, K, dtype=torch.float32)" in source
    gdn = pytest.importorskip("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn")
    core = inspect.getsource(gdn)
    assert "initial_state = ssm_state[prefill_state_indices]" in core
    assert "ssm_state[prefill_state_indices] = last_recurrent_state.to(ssm_state.dtype)" in core
    assert "fi_state = initial_state.to(torch.float32)" in core


def test_the_layer_token_bytes_take_the_wider_gdn_projections() -> None:
    """A Qwen3-Next-class GDN layer holds, per token, in_proj_qkvz's 2 x 16 x 128 + 2 x 32 x 128
    = 12,288, in_proj_ba's 64, mixed_qkv's 8,192, z's and core_attn_out's 4,096 each: 28,736
    elements, against its attention layers' q, k, v and KV written."""
    from memest.estimate.model_shape import layer_token_bytes

    layer = gdn_layer(QWEN3_NEXT, tp=1, dtype_bytes=2)
    assert layer is not None and layer.token_width == 12288 + 64 + 8192 + 4096 + 4096
    shape = model_shape(QWEN3_NEXT)
    without = dataclasses.replace(shape, gdn=None)
    assert shape.qkv + shape.kv < layer.token_width
    extra = layer_token_bytes(shape) - layer_token_bytes(without)
    assert extra == 2 * (layer.token_width - (shape.qkv + shape.kv))


def test_a_whatifs_model_gives_the_prefill_a_report_recorded_no_fields_for() -> None:
    """A report recorded before the plugin knew the linear-attention fields: the what-if's
    config.json (its movers' shape) gives the term, as the movers read it."""
    from memest.estimate.sampler import run_serving_step_bytes
    from memest.schema import ModelShape as RecordedDims
    from memest.schema import RunConfig

    recorded = RecordedDims.model_validate(
        {k: v for k, v in QWEN3_NEXT.items() if k in RecordedDims.model_fields}
        | {"linear_num_value_heads": None, "layer_types": None}
    )
    config = RunConfig(
        model="qwen3next",
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        model_dims=recorded,
        gdn_prefill_backend="triton",
    )
    shape = model_shape(QWEN3_NEXT)
    with_prefill = serving_step_reserve_bytes(activation_shape(shape), 64, 2048, "triton")
    assert run_serving_step_bytes(config, shape) == with_prefill
    assert run_serving_step_bytes(config) < with_prefill  # the recorded dims alone lack it
