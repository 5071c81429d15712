"""Layer kinds from config.json and the pre-flight's KV-cache groups for hybrid models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memest.errors import ConfigError
from memest.estimate import kv_groups
from memest.estimate.layer_kinds import is_hybrid, layer_kinds
from memest.estimate.linear_attention import state_blocks, state_shape
from memest.preflight.predict import preflight, request_from

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests" / "data" / "configs"
LAB = ROOT / "lab" / "models"


def _cfg(name: str) -> dict[str, Any]:
    path = LAB / name / "config.json" if (LAB / name).is_dir() else CONFIGS / f"{name}.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("gemma3_6l", ["sliding_window"] * 5 + ["full_attention"]),
        ("gemma3_12l", (["sliding_window"] * 5 + ["full_attention"]) * 2),
        ("gpt_oss_6l", ["sliding_window", "full_attention"] * 3),
        ("mistral_sliding_4l", ["sliding_window"] * 4),
        ("qwen3next_a3b_4l", ["gated_delta_net"] * 3 + ["full_attention"]),
        ("qwen3next_8l", (["gated_delta_net"] * 3 + ["full_attention"]) * 2),
        ("kimi_linear_4l", ["kda"] * 3 + ["mla"]),
        (
            "nemotron_h_8l",
            ["mamba2", "none", "mamba2", "full_attention", "none", "mamba2", "none", "mamba2"],
        ),
        ("granite4_8l", (["mamba2"] * 3 + ["full_attention"]) * 2),
        ("llama8b", ["full_attention"] * 32),
    ],
)
def test_layer_kinds(name: str, kinds: list[str]) -> None:
    got = layer_kinds(_cfg(name))
    assert list(got) == kinds
    assert is_hybrid(got) == (name != "llama8b")


def test_qwen_without_use_sliding_window_is_full_attention() -> None:
    cfg = {"model_type": "qwen3", "num_hidden_layers": 4, "sliding_window": 32768}
    assert layer_kinds(cfg) == ("full_attention",) * 4
    assert layer_kinds({**cfg, "use_sliding_window": True, "max_window_layers": 2}) == (
        "full_attention",
        "full_attention",
        "sliding_window",
        "sliding_window",
    )


@pytest.mark.parametrize(
    ("cfg", "named"),
    [
        (
            {"num_hidden_layers": 2, "layer_types": ["full_attention", "chunked_attention"]},
            "chunked_attention",
        ),
        ({"num_hidden_layers": 2, "attention_chunk_size": 8192}, "attention_chunk_size"),
        ({"hybrid_override_pattern": "M*X"}, "X"),
        ({"num_hidden_layers": 4, "layers_block_type": ["mamba"] * 4}, "layers_block_type"),
    ],
)
def test_an_unknown_layer_kind_is_refused_by_name(cfg: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        layer_kinds(cfg)


def test_gemma3n_shared_kv_layers_hold_nothing() -> None:
    cfg = {**_cfg("gemma3_6l"), "num_kv_shared_layers": 2}
    assert layer_kinds(cfg)[-2:] == ("shared_kv", "shared_kv")


def test_qwen3_next_state_is_vllms() -> None:
    # GDN: conv (4 - 1) x (128 x 16 x 2 + 128 x 32) bf16 + recurrent 32 x 128 x 128 bf16
    st = state_shape(_cfg("qwen3next_a3b_4l"), "gated_delta_net", tp=1, dtype_bytes=2)
    assert (st.conv_bytes, st.recurrent_bytes) == (49_152, 1_048_576)
    assert state_shape(_cfg("qwen3next_a3b_4l"), "gated_delta_net", tp=2, dtype_bytes=2).bytes == (
        1_097_728 // 2
    )
    assert state_blocks("gated_delta_net", align=True) == 3  # + boundary + FlashInfer checkpoint
    assert state_blocks("gated_delta_net", align=False, spec_tokens=3) == 4


def test_nemotron_ssm_state_is_float32() -> None:
    st = state_shape(_cfg("nemotron_h_8l"), "mamba2", tp=1, dtype_bytes=2)
    assert st.recurrent_bytes == 128 * 80 * 128 * 4
    assert st.conv_bytes == 3 * (128 * 80 + 2 * 8 * 128) * 2


def _pre(name: str, **flags: Any) -> Any:
    fields = {
        "model_config_json": _cfg(name),
        "gpu": "h200",
        "max_model_len": 4096,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 4096,
        **flags,
    }
    return preflight(request_from(fields))


def test_preflight_qwen3_next_raises_the_block_to_576() -> None:
    out = _pre("qwen3next_a3b_4l")
    groups = out.kv_cache.groups
    assert [g.kind for g in groups] == ["mamba"] * 3 + ["full_attention"]
    assert {g.block_size for g in groups} == {576}
    assert {g.page_size_bytes for g in groups} == {576 * 2048}
    assert groups[0].real_page_size_bytes == 1_097_728  # padded by 7.46 %


def test_preflight_tokens_are_the_groups_arithmetic() -> None:
    out = _pre("gemma3_12l", max_model_len=131072)
    lengths = kv_groups.Lengths(131072, 4096)
    assert out.kv_tokens == kv_groups.kv_tokens(out.kv_cache, out.kv_budget_bytes, lengths)
    # per request: five sliding groups of cdiv(1023 + 2 x 4096, 16) + 1 = 577 blocks and the
    # full group's 8,192, against 6 x 8,192 were every layer full attention
    assert kv_groups.blocks_per_request(out.kv_cache, lengths) == 5 * 577 + 8192
    dense = out.kv_budget_bytes // (12 * 2 * 4 * 256 * 2)
    assert out.kv_tokens > 4 * dense


def test_a_max_model_len_change_moves_full_groups_only() -> None:
    short, long = _pre("qwen3next_a3b_4l"), _pre("qwen3next_a3b_4l", max_model_len=65536)
    # the state groups hold 3 blocks a request at both lengths; the full group grows 16-fold
    assert short.max_concurrency / long.max_concurrency < 16 / 2


def test_a_hybrid_drafter_is_refused() -> None:
    with pytest.raises(ConfigError, match="drafter"):
        _pre("gemma3_6l", speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
