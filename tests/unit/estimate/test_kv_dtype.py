"""FP8 KV cache (--kv-cache-dtype): bytes per element, the what-if's grid field, real H200 starts.

Real starts (reports/vllm/raw): call 3's bf16 apply start A_llama8b_s128_t4096 and call 23's
F_llama8b_s128_t4096_fp8kv, the same flags with --kv-cache-dtype fp8 (apply: 1,672,144 KV
tokens, a 1,048,576-byte page of 16 tokens over 32 layers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate.kv import kv_bytes_per_token, kv_cache_dtype_bytes, rescale_kv_dtype
from memest.estimate.whatif.models import WhatIfQuestion
from memest.estimate.whatif.question import answer
from memest.preflight.calibration import what_if_calibration
from memest.schema import KVCacheSpec, RunReport

RAW = Path(__file__).resolve().parents[3] / "tests/data/starts"
BF16_APPLY = RAW / "call3.A_llama8b_s128_t4096.apply.report.rank0.json"
FP8_APPLY = RAW / "call23.F_llama8b_s128_t4096_fp8kv.apply.report.rank0.json"
FP8_APPLY_TOKENS = 1_672_144  # results.call23.jsonl, F_llama8b_s128_t4096_fp8kv apply


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("auto", 2), (None, 2), ("bfloat16", 2), ("fp8", 1), ("fp8_e4m3", 1), ("fp8_e5m2", 1)],
)
def test_kv_element_bytes_follow_vllms_dtype_table(dtype: str | None, expected: int) -> None:
    assert kv_cache_dtype_bytes(dtype, 2) == expected


def test_an_unknown_kv_dtype_is_named() -> None:
    with pytest.raises(ConfigError, match="kv_cache_dtype.*int3"):
        kv_cache_dtype_bytes("int3", 2)


def test_fp8_halves_llama8bs_page() -> None:
    # 2 (K, V) x 8 KV heads x 128 x 32 layers x 1 B = 65,536 B per token: F's recorded page / 16
    bf16 = KVCacheSpec(num_layers=32, num_kv_heads=8, head_size=128, block_size=16)
    fp8 = rescale_kv_dtype(bf16, 1, "fp8")
    assert kv_bytes_per_token(bf16) == 131_072
    assert kv_bytes_per_token(fp8) == 65_536 == 1_048_576 // 16
    assert fp8.dtype == "fp8" and fp8.dtype_bytes == 1


def test_the_recorded_fp8_start_holds_one_byte_per_element() -> None:
    spec = RunReport.model_validate_json(FP8_APPLY.read_text()).kv_cache
    assert spec is not None and spec.dtype_bytes == 1
    assert kv_bytes_per_token(spec) == 65_536


def test_whatif_fp8_from_a_bf16_start_lands_near_the_fp8_start() -> None:
    report = RunReport.model_validate_json(BF16_APPLY.read_text())
    got = answer(
        report,
        WhatIfQuestion(grid={"kv_cache_dtype": "fp8"}),
        calibration=what_if_calibration(report),
    ).what_if
    assert got.kv_bytes_per_token_from == 131_072 and got.kv_bytes_per_token_to == 65_536
    assert got.kv_tokens_from is not None and got.kv_tokens_to is not None
    # The budget does not move; twice the tokens, in whole 16-token blocks.
    assert got.kv_budget_bytes_to == got.kv_budget_bytes_from
    assert got.kv_tokens_to == got.kv_budget_bytes_to // 1_048_576 * 16
    # Measured: 1,665,760 predicted vs 1,672,144 started (-0.38 %); within 0.5 %.
    error = (got.kv_tokens_to - FP8_APPLY_TOKENS) / FP8_APPLY_TOKENS
    assert abs(error) < 0.005, error


def test_whatif_back_to_auto_from_the_fp8_start_doubles_the_page() -> None:
    report = RunReport.model_validate_json(FP8_APPLY.read_text())
    got = answer(
        report,
        WhatIfQuestion(grid={"kv_cache_dtype": "auto"}),
        calibration=what_if_calibration(report),
    ).what_if
    assert got.kv_bytes_per_token_to == 131_072  # the recorded model dtype, bfloat16


def test_a_refused_kv_dtype_is_a_grid_field() -> None:
    report = RunReport.model_validate_json(BF16_APPLY.read_text())
    with pytest.raises(ConfigError, match="grid.kv_cache_dtype"):
        answer(
            report,
            WhatIfQuestion(grid={"kv_cache_dtype": "int3"}),
            calibration=what_if_calibration(report),
        )
