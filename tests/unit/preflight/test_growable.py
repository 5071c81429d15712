"""The pre-flight for vLLM 0.34: its growable KV cache's sizing beside memest's (--vllm-version)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from memest.preflight.growable import predict_growable
from memest.schema import FullInitTerms, KVCacheSpec
from memest.vllm_versions import resolve_version

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "tests/data/configs/llama8b.json"
GIB = 1 << 30
SPEC = KVCacheSpec(num_layers=32, num_kv_heads=8, head_size=128, block_size=16)  # 2 MiB blocks


def _terms(activation: int) -> FullInitTerms:
    return FullInitTerms(
        requested_bytes=100 * GIB,
        weights_bytes=14 * GIB,
        profile_peak_activation_bytes=activation,
        mla_context_bytes=0,
        outside_torch_bytes=1 * GIB,
        graph_pool_bytes=1 * GIB,
        runner_buffer_bytes=0,
        profiling_residue_bytes=0,
        baseline_torch_bytes=0,
        source="test",  # 16 GiB resident after capture
    )


def test_vllm_keeps_its_margin_and_memest_its_own() -> None:
    got = predict_growable(
        resolve_version("0.34.0"),
        _terms(4 * GIB),
        SPEC,
        total_bytes=140 * GIB,
        gpu_memory_utilization=None,
        memest_margin_bytes=GIB // 4,
    )
    assert got is not None and got.gpu_memory_utilization == 1.0
    # 140 GiB less 16 resident, less the 4 GiB peak; vLLM's margin max(1, 0.75 x 4) = 3 GiB
    assert (got.vllm_kv_bytes, got.vllm_margin_bytes) == (117 * GIB, 3 * GIB)
    assert got.memest_kv_bytes == int(119.75 * GIB)
    assert got.vllm_kv_tokens == 117 * GIB // (2 << 20) * 16


def test_a_small_peak_gets_vllms_one_gib_floor() -> None:
    got = predict_growable(
        resolve_version("0.34.0"),
        _terms(GIB // 2),
        SPEC,
        total_bytes=140 * GIB,
        gpu_memory_utilization=None,
    )
    assert got is not None and got.vllm_margin_bytes == GIB
    assert got.memest_kv_bytes - got.vllm_kv_bytes == GIB


def test_an_explicit_utilization_caps_both() -> None:
    got = predict_growable(
        resolve_version("0.34.0"),
        _terms(4 * GIB),
        SPEC,
        total_bytes=140 * GIB,
        gpu_memory_utilization=0.5,
    )
    assert got is not None and got.gpu_memory_utilization == 0.5
    assert got.vllm_kv_bytes == got.memest_kv_bytes == 70 * GIB - 16 * GIB - 4 * GIB


def test_vllm_033_has_no_growable_cache() -> None:
    got = predict_growable(
        resolve_version("0.33.0"),
        _terms(GIB),
        SPEC,
        total_bytes=140 * GIB,
        gpu_memory_utilization=None,
    )
    assert got is None


def test_the_cli_names_the_release_and_both_sizings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--model-config", str(LLAMA), "--vllm-version", "0.34.0"]) == 0
    text = capsys.readouterr().out
    assert "vLLM 0.34.0, growable KV cache at utilization 1.0: vLLM's sizing commits" in text
    assert "with MEMEST_ENABLE=1 MEMEST_ESTIMATE=apply" in text
    assert (
        main(["preflight", "--model-config", str(LLAMA), "--vllm-version", "0.33.0", "--json"]) == 0
    )
    old = json.loads(capsys.readouterr().out)
    assert (old["vllm_version"], old["growable_kv"]) == ("0.33.0", None)


def test_an_unsupported_release_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--model-config", str(LLAMA), "--vllm-version", "0.32.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "vllm_version='0.32.0'" in err
