"""The KV block size: each vLLM release's rule per attention backend, --block-size, and what it
moves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from memest.errors import ConfigError
from memest.preflight import preflight
from memest.preflight.backends import kv_block_size
from memest.schema import RunReport
from memest.schema.preflight import PreflightRequest
from memest.vllm_versions import resolve_version

ROOT = Path(__file__).resolve().parents[3]
DSV2 = json.loads((ROOT / "lab/models/dsv2lite_8l/config.json").read_text())
LLAMA = json.loads((ROOT / "tests/data/configs/llama8b.json").read_text())
GRID = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_model_len": 4096}
V033, V034 = resolve_version("0.33.0"), resolve_version("0.34.0")


@pytest.mark.parametrize(
    ("mla", "backend", "block", "expected"),
    [
        (False, None, None, (16, "FLASH_ATTN")),  # Hopper MHA/GQA default
        (True, None, None, (16, "FLASH_ATTN_MLA")),  # Hopper MLA default
        (True, "FLASHMLA", None, (64, "FLASHMLA")),  # FlashMLA's kernels take 64 only
        (True, "flashinfer_mla", None, (32, "FLASHINFER_MLA")),
        (True, "TRITON_MLA", None, (16, "TRITON_MLA")),
        (True, None, 64, (64, "FLASH_ATTN_MLA")),  # --block-size: the user's
        (True, "FLASHMLA", 128, (128, "FLASHMLA")),  # a multiple of the kernel block
        (False, "FLASHINFER", 32, (32, "FLASHINFER")),
    ],
)
def test_hopper_block_size(
    mla: bool, backend: str | None, block: int | None, expected: tuple[int, str]
) -> None:
    got = kv_block_size(mla=mla, sm100=False, backend=backend, block_size=block, vllm=V033)
    assert got == expected


@pytest.mark.parametrize(
    ("mla", "backend", "block", "field"),
    [
        (True, None, 8, "block_size"),  # no MLA backend takes 8-token blocks
        (True, "FLASHMLA", 32, "block_size"),
        (False, "FLASHMLA", None, "attention_backend"),  # an MLA backend for a GQA model
        (False, "NO_SUCH", None, "attention_backend"),
        (True, "CUTLASS_MLA", None, "attention_backend"),  # Blackwell only
    ],
)
def test_refused_block_size_or_backend_is_named(
    mla: bool, backend: str | None, block: int | None, field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        kv_block_size(mla=mla, sm100=False, backend=backend, block_size=block, vllm=V033)


@pytest.mark.parametrize(
    ("mla", "sm100", "backend", "block", "expected"),
    [
        (False, False, None, None, (64, "FLASH_ATTN")),  # 64 is a multiple of 16
        (True, False, None, None, (64, "FLASH_ATTN_MLA")),
        (True, False, "flashinfer_mla", None, (64, "FLASHINFER_MLA")),  # 32 on 0.33.0
        (True, True, "CUTLASS_MLA", None, (128, "CUTLASS_MLA")),  # refuses 64: its smallest
        (False, True, None, None, (64, "FLASHINFER")),
        (True, False, None, 16, (16, "FLASH_ATTN_MLA")),  # --block-size: the user's
    ],
)
def test_vllm_034_tries_64_token_blocks_first(
    mla: bool, sm100: bool, backend: str | None, block: int | None, expected: tuple[int, str]
) -> None:
    got = kv_block_size(mla=mla, sm100=sm100, backend=backend, block_size=block, vllm=V034)
    assert got == expected


def test_the_034_start_measured_64_token_blocks() -> None:
    """Call 47's Llama-3-8B start on vLLM 0.34.0 (FLASH_ATTN, no --block-size) had 64-token
    blocks, the pre-flight's prediction for it; call 11's on 0.33.0 had 16."""
    starts = ROOT / "tests/data/starts"
    new = RunReport.model_validate_json(
        (starts / "call47.A_llama8b_s128_t4096_udef.apply.report.rank0.json").read_text()
    )
    old = RunReport.model_validate_json(
        (starts / "call11.W1_llama8b_s32_t4096.apply.report.rank0.json").read_text()
    )
    assert new.kv_cache is not None and old.kv_cache is not None
    predicted = {
        v: preflight(
            PreflightRequest.model_validate({"model_config": LLAMA, **GRID, "vllm_version": v})
        ).block_size
        for v in ("0.33.0", "0.34.0")
    }
    assert predicted == {"0.33.0": old.kv_cache.block_size, "0.34.0": new.kv_cache.block_size}


def test_cli_vllm_version_picks_the_block_size(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(ROOT / "lab/models/dsv2lite_8l/config.json")
    got = {}
    for version in ("0.33.0", "0.34.0"):
        argv = ["preflight", "--model-config", cfg, "--vllm-version", version, "--json"]
        assert main([*argv, "--attention-backend", "FLASHINFER_MLA"]) == 0
        out = json.loads(capsys.readouterr().out)
        got[version] = (out["block_size"], out["kv_cache"]["block_size"])
        assert out["kv_tokens"] % out["block_size"] == 0  # whole blocks
    assert got == {"0.33.0": (32, 32), "0.34.0": (64, 64)}


def test_flashmla_blocks_size_the_kv_cache_and_block_tables() -> None:
    at16 = preflight(
        PreflightRequest.model_validate({"model_config": DSV2, **GRID, "vllm_version": "0.33.0"})
    )
    at64 = preflight(
        PreflightRequest.model_validate(
            {
                "model_config": DSV2,
                **GRID,
                "attention_backend": "FLASHMLA",
                "vllm_version": "0.33.0",
            }
        )
    )
    assert (at16.block_size, at64.block_size) == (16, 64)
    assert at64.kv_cache.block_size == 64
    assert at64.kv_cache.page_size_bytes == 64 * (512 + 64) * 2 * 8  # latent + RoPE, bf16, 8 layers
    assert at64.kv_tokens % 64 == 0 and at16.kv_tokens % 16 == 0
    # vLLM's block tables: 2 x max_num_seqs x ceil(max_model_len / block) int32 entries
    assert (
        at16.terms.runner_buffer_bytes - at64.terms.runner_buffer_bytes == 2 * 64 * (256 - 64) * 4
    )


def test_weights_term_moves_by_vllms_sampler_buffers() -> None:
    """Penalties (seqs x vocab fp32 + bit masks) and structured-output masks, by hand."""
    big, small = (
        preflight(
            PreflightRequest.model_validate({"model_config": LLAMA, **GRID, "max_num_seqs": seqs})
        )
        for seqs in (128, 32)
    )
    words = -(-128256 // 32)  # one int32 per 32 tokens of vocabulary

    def blocks(n: int) -> int:
        return -(-n // 512) * 512

    def sampler(seqs: int) -> int:
        return (
            blocks(seqs * 128256 * 4)
            + blocks(seqs * words * 4)
            + blocks(seqs * 4)
            + blocks(seqs * words * 4)
        )

    assert big.terms.weights_bytes - small.terms.weights_bytes == sampler(128) - sampler(32)


def test_cli_block_size_flags(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(ROOT / "lab/models/dsv2lite_8l/config.json")
    argv = ["preflight", "--model-config", cfg, "--vllm-version", "0.33.0"]
    assert main([*argv, "--attention-backend", "FLASHMLA", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["block_size"], got["attention_backend"]) == (64, "FLASHMLA")
    assert main([*argv, "--block-size", "8"]) == 2
    err = capsys.readouterr().err
    assert "block_size" in err and len(err.strip().splitlines()) == 1
