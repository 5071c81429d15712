"""Adding and dropping an EAGLE3 drafter: its weights from its config's shapes, its buffers
allocated with the KV cache, its workspaces and graph objects by layers, checked against real
H200 starts of one model with and without the drafter (tests/data/starts, copied from reports/vllm/raw)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate import full_init_kv_budget, full_init_terms, what_if
from memest.estimate.drafter_weights import drafter_weight_bytes
from memest.estimate.runner_buffers import ModelDims
from memest.estimate.whatif_synthetic import shapes
from memest.schema import RunReport
from memest.units import MiB

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "tests" / "data" / "starts"
MODEL = json.loads((ROOT / "examples" / "llama8b.config.json").read_text())
DRAFTER = json.loads((ROOT / "examples" / "eagle3_8b.config.json").read_text())
EAGLE3 = {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3}}


def _real(name: str) -> RunReport:
    return RunReport.model_validate_json((RAW / f"{name}.report.rank0.json").read_text())


def _dims(report: RunReport) -> ModelDims:
    dims = ModelDims.from_report(report, MODEL, drafter=DRAFTER)
    assert dims is not None
    return dims


def test_eagle3_weights_from_the_layout_of_llama_eagle3() -> None:
    h, inter, heads, kv, hd = 4096, 14336, 32, 8, 128
    by_hand = (
        3 * h * h * 2  # fc: three aux hidden states -> hidden
        + 2 * h * (heads + 2 * kv) * hd * 2  # layer 0 qkv_proj takes [embeds, hidden]
        + heads * hd * h * 2  # o_proj
        + h * 2 * inter * 2  # gate_up_proj
        + inter * h * 2  # down_proj
        + 4 * h * 2  # input, hidden and post-attention norms, final norm
    )  # embedding and lm_head: the target's (same vocabulary)
    assert drafter_weight_bytes(DRAFTER, MODEL, "eagle3", 2) == by_hand
    own_head = {**DRAFTER, "draft_vocab_size": 32000}
    assert drafter_weight_bytes(own_head, MODEL, "eagle3", 2) == by_hand + 32000 * h * 2 + 32000 * 8
    with pytest.raises(ConfigError, match="eagle"):
        drafter_weight_bytes(DRAFTER, MODEL, "mtp", 2)
    with pytest.raises(ConfigError, match="intermediate_size"):
        drafter_weight_bytes(
            {k: v for k, v in DRAFTER.items() if k != "intermediate_size"}, MODEL, "eagle3", 2
        )


@pytest.mark.parametrize(
    ("plain", "eagle"),
    [
        ("call9.S_llama8b_s128_t4096.apply", "call6.C_llama8b_eagle3k3_s64_t4096.apply"),
        ("call5.B_llama8b_s32_t2048.apply", "call6.C_llama8b_eagle3k3_s64_t4096.apply"),
    ],
)
def test_adding_the_drafter_moves_weights_and_graph_objects_as_measured(
    plain: str, eagle: str
) -> None:
    g, g2 = _real(plain), _real(eagle)
    change = {
        "max_num_seqs": g2.config.max_num_seqs,
        "max_num_batched_tokens": g2.config.max_num_batched_tokens,
        **EAGLE3,
    }
    result = what_if(g, change, dims=_dims(g))
    measured = full_init_terms(g2)
    assert result.terms_to is not None and result.terms_from is not None
    # The drafter's weights (560 MiB), less the penalties buffers of fewer sequences.
    grown = result.terms_to.weights_bytes - result.terms_from.weights_bytes
    assert grown > 500 * MiB
    assert abs(result.terms_to.weights_bytes - measured.weights_bytes) < 4 * MiB
    assert "drafter weights" in result.term_laws["weights_bytes"]
    # Graph objects by layers: 95 one-layer drafter graphs are cheap (a raw count missed by
    # +255..+412 MiB on these pairs; by layers +4.7 and -21.1 MiB).
    assert abs(result.terms_to.outside_torch_bytes - measured.outside_torch_bytes) < 25 * MiB
    # Buffers allocated with the KV cache and the drafter's workspaces move the runner and
    # residue terms toward the measurement (still short: see reports/vllm/whatif_terms.txt).
    for term in ("runner_buffer_bytes", "profiling_residue_bytes"):
        before = abs(getattr(result.terms_from, term) - getattr(measured, term))
        after = abs(getattr(result.terms_to, term) - getattr(measured, term))
        assert after < before / 2, term


def test_dropping_the_drafter_frees_what_its_start_measured() -> None:
    c, s = (
        _real("call6.C_llama8b_eagle3k3_s64_t4096.apply"),
        _real("call9.S_llama8b_s128_t4096.apply"),
    )
    change = {"max_num_seqs": 128, "speculative_config": None}
    result = what_if(c, change, dims=_dims(c))
    # the other start read with the same model shape (its report predates recorded dimensions),
    # so both hold the prompt-logprobs chunk derived from it
    measured = full_init_terms(s, shape=shapes(_dims(c)).target)
    assert result.terms_to is not None and result.kv_budget_bytes_to is not None
    assert abs(result.terms_to.weights_bytes - measured.weights_bytes) < 4 * MiB
    assert abs(result.terms_to.outside_torch_bytes - measured.outside_torch_bytes) < 100 * MiB
    assert s.config.gpu_memory_utilization == c.config.gpu_memory_utilization
    # Within 0.2 GiB of the KV budget the other start's terms give (0.75 GiB before the drafter
    # was modelled).
    assert abs(result.kv_budget_bytes_to - full_init_kv_budget(measured)) < 200 * MiB


def test_without_the_drafter_config_the_note_says_what_is_missing() -> None:
    s = _real("call9.S_llama8b_s128_t4096.apply")
    dims = ModelDims.from_report(s, MODEL)
    result = what_if(s, EAGLE3, dims=dims)
    assert result.terms_to is not None and result.terms_from is not None
    assert result.terms_to.weights_bytes - result.terms_from.weights_bytes < 100 * MiB
    assert any(n.startswith("DRAFTER WEIGHTS NOT MOVED") for n in result.notes)
    assert "NOT MOVED" in result.term_laws["weights_bytes"]


def test_without_any_dimensions_an_added_or_dropped_drafter_is_said_loudly() -> None:
    e = _real("call8.E_llama8b_eagle3k5_s96_t4096_u088.apply")
    result = what_if(e, {"speculative_config": None})
    assert result.terms_to is not None and result.terms_from is not None
    assert result.terms_to.weights_bytes == result.terms_from.weights_bytes
    assert result.term_laws["weights_bytes"].startswith("NOT MOVED")
    assert any("drops the eagle3 drafter" in n and "too high" in n for n in result.notes)
    # Notes name what is missing, never a command-line flag (the web form shows them).
    assert not [n for n in result.notes if "--" in n]


def _per_token(report: RunReport) -> int:
    spec = report.kv_cache
    assert spec is not None and spec.page_size_bytes is not None
    return spec.page_size_bytes // spec.block_size


@pytest.mark.parametrize("with_configs", [True, False])
def test_adding_the_drafter_adds_its_kv_layer(with_configs: bool) -> None:
    s = _real("call9.S_llama8b_s128_t4096.apply")
    c = _real("call6.C_llama8b_eagle3k3_s64_t4096.apply")
    assert c.kv_cache is not None and c.kv_cache.kv_tokens is not None
    change = {"max_num_seqs": 64, **EAGLE3}
    result = what_if(s, change, dims=_dims(s) if with_configs else None)
    # vLLM 0.33.0 holds the drafter's layer in the same KV blocks: C's spec has one more layer.
    assert result.kv_bytes_per_token_from == _per_token(s)
    assert result.kv_bytes_per_token_to == _per_token(c)
    assert result.kv_tokens_to is not None
    if with_configs:  # C measured 802,432 tokens; G's bytes per token gave 829,552 (+3.4 %)
        assert abs(result.kv_tokens_to - c.kv_cache.kv_tokens) < 0.002 * c.kv_cache.kv_tokens


def test_dropping_the_drafter_drops_its_kv_layer() -> None:
    e = _real("call8.E_llama8b_eagle3k5_s96_t4096_u088.apply")
    s = _real("call9.S_llama8b_s128_t4096.apply")
    result = what_if(e, {"speculative_config": None}, dims=_dims(e))
    assert result.kv_bytes_per_token_to == _per_token(s)
    assert result.kv_budget_bytes_to is not None and result.kv_tokens_to is not None
    assert result.kv_tokens_to == result.kv_budget_bytes_to // (_per_token(s) * 16) * 16
