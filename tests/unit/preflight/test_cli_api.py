"""memest preflight: the result, bad input named in one line (the API: tests/integration/service/test_preflight_api.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from memest.estimate import account
from memest.schema import RunReport

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "tests/data/configs/llama8b.json"
DSV2 = ROOT / "lab/models/dsv2lite_8l/config.json"
S_START = ROOT / "tests/data/starts/call9.S_llama8b_s128_t4096.apply.report.rank0.json"
GRID = [
    "--max-num-seqs",
    "128",
    "--max-num-batched-tokens",
    "4096",
    "--max-model-len",
    "4096",
    "--gpu-memory-utilization",
    "0.85",
]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["preflight", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_holds_kv_bytes_and_tokens_near_the_measured_exact_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(capsys, "--model-config", str(LLAMA), "--gpu", "h200", *GRID, "--json")
    assert code == 0
    got = json.loads(out)
    acc = account(RunReport.model_validate_json(S_START.read_text()))
    assert acc.kv_cache_bytes is not None and acc.usage_minus_budget_bytes is not None
    exact = acc.kv_cache_bytes - acc.usage_minus_budget_bytes
    assert abs(got["kv_cache_bytes"] - exact) < (1 << 30) // 4
    assert got["kv_tokens"] == got["kv_cache_bytes"] // (32 * 2 * 8 * 128 * 2)
    assert got["kv_tokens_low"] <= got["kv_tokens"] <= got["kv_tokens_high"]
    assert got["measured_family"] is True


def test_unmeasured_family_and_tp_get_a_note_and_a_wider_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = _run(capsys, "--model-config", str(LLAMA), *GRID, "--json")
    llama = json.loads(out)
    _, out, _ = _run(capsys, "--model-config", str(DSV2), "--tensor-parallel-size", "2", "--json")
    mla = json.loads(out)
    assert mla["family"] == "mla" and mla["measured_family"] is False
    assert any("no measured start" in n and "DeepseekV2" in n for n in mla["notes"])
    assert any("tensor_parallel_size=2" in n for n in mla["notes"])
    assert mla["kv_cache_uncertainty_bytes"] > 5 * llama["kv_cache_uncertainty_bytes"]


def test_text_output_names_every_term(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "--model-config",
        str(LLAMA),
        *GRID,
        "--speculative-config",
        '{"method": "eagle3", "num_speculative_tokens": 3}',
    )
    assert code == 0
    for label in ("weights", "graph pools", "outside PyTorch (context, NCCL, graphs)"):
        assert any(line.startswith(label + " ") for line in out.splitlines()), label
    assert "KV cache per rank" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model-config", "/nonexistent/config.json"], "/nonexistent/config.json"),
        (["--model-config", str(LLAMA), "--gpu", "a100"], "gpu='a100'"),
        (["--model-config", str(LLAMA), "--speculative-config", "{bad"], "--speculative-config"),
        (["--model-config", str(LLAMA), "--tensor-parallel-size", "3"], "num_attention_heads"),
        (["--model-config", str(LLAMA), "--gpu-memory-utilization", "1.5"], "gpu_memory_util"),
        (["--model-config", str(LLAMA), "--attention-config", "[2]"], "--attention-config"),
        (
            ["--model-config", str(LLAMA), "--attention-config", '{"flash_attn_version": 5}'],
            "attention_config.flash_attn_version",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, _, err = _run(capsys, *args)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_settings_that_leave_no_kv_cache_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--model-config", str(LLAMA), "--gpu-memory-utilization", "0.05")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "does not fit: non-KV " in line and "> budget " in line
    # the figures are the result's own: a utilization that fits gives the same non-KV figure
    _, ok, _ = _run(capsys, "--model-config", str(LLAMA), "--json")
    non_kv_gib = json.loads(ok)["non_kv_bytes"] / (1 << 30)
    said = float(line.split("non-KV ")[1].split(" GiB")[0])
    assert non_kv_gib > said * 0.9  # the weights alone (16 GB of bf16) exceed 5 % of an H200
    budget = float(line.split("budget ")[1].split(" GiB")[0])
    assert budget < said and abs(budget - 0.05 * 143771 / 1024) < 0.1  # H200: 143,771 MiB


def test_a_kv_cache_shorter_than_one_request_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 8192 tokens x 128 KiB per token = 1 GiB: a budget leaving less refuses max_model_len
    code, _, err = _run(capsys, "--model-config", str(LLAMA), "--gpu-memory-utilization", "0.135")
    assert code == 2 and "does not fit: one request of max_model_len 8,192 tokens" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "max_num_batched_tokens"),
        (["--max-model-len", "16384"], "max_position_embeddings=8192"),
        (["--compilation-config", '{"foo": 1}'], "compilation_config.foo"),
        (["--speculative-config", "[1, 2]"], "expected a JSON object"),
        (["--speculative-config", "notjson"], "neither inline JSON"),
        (["--max-num-seqs", "99999999999999999999999"], "max_num_seqs"),
    ],
)
def test_settings_vllm_refuses_are_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, _, err = _run(capsys, "--model-config", str(LLAMA), *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_folder_as_config_is_named_without_a_descriptor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _run(capsys, "--model-config", str(tmp_path))
    assert (
        code == 2
        and err.strip()
        == f"memest preflight: --model-config {tmp_path}: not a regular file (a folder)"
    )


def test_config_without_max_position_embeddings_is_noted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = json.loads(LLAMA.read_text())
    del cfg["max_position_embeddings"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, _ = _run(capsys, "--model-config", str(path), "--json")
    got = json.loads(out)
    assert code == 0 and got["max_model_len"] == 2048  # vLLM 0.33.0's default in that case
    assert any("no max_position_embeddings" in n for n in got["notes"])


def test_overshoot_and_concurrency_lines(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "--model-config", str(LLAMA), *GRID)
    assert "calibration starts whose KV cache vLLM sized" in out
    conc = next(line for line in out.splitlines() if "max concurrency" in line)
    tokens = int(conc.split(": ")[2].split(" tokens")[0].replace(",", ""))
    assert f"max concurrency {tokens / 4096:.2f}× at max_model_len 4,096" in conc
    _, out, _ = _run(capsys, "--model-config", str(LLAMA), *GRID, "--tensor-parallel-size", "2")
    assert "calibration starts" not in out  # no calibration start ran TP 2
    _, out, _ = _run(capsys, "--model-config", str(DSV2), "--json")
    assert json.loads(out)["vllm_overshoot"] is None  # nor an MLA model


DSV2 = ROOT / "lab/models/dsv2lite_8l/config.json"
MLA_GRID = ["--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--max-model-len", "4096"]


def _terms(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, int]:
    code, out, _ = _run(capsys, *args, "--json")
    assert code == 0
    return dict(json.loads(out)["terms"])


def test_mla_context_term_follows_the_flash_attention_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """FlashAttention 2 pads MLA's v (one more [tokens, heads, qk] tensor than FA3, the SM90
    default), for the workspace chunk (32,768 rows at max_model_len 4,096) and for the step's
    2,048 new tokens: 16 heads x 192 x 2 B each for DeepSeek-V2-Lite. A dense model has no term."""
    fa3 = _terms(capsys, "--model-config", str(DSV2), *MLA_GRID)
    fa2 = _terms(
        capsys,
        "--model-config",
        str(DSV2),
        *MLA_GRID,
        "--attention-config",
        '{"flash_attn_version": 2}',
    )
    row = 16 * 192 * 2  # one token's padded v, or its k
    assert fa2["mla_context_bytes"] - fa3["mla_context_bytes"] == (32768 + 2048) * row
    # FA3: the chunk's k (its kv_nope is the profile run's stand-in), the step's kv_nope and k,
    # less the prompt-logprobs chunk the activation term holds (1,024 x 102,400 bf16 logits)
    chunk = 1024 * 102400 * 2
    assert fa3["mla_context_bytes"] == 32768 * row + 2048 * 16 * 256 * 2 + 2048 * row - chunk
    assert _terms(capsys, "--model-config", str(LLAMA), *GRID)["mla_context_bytes"] == 0
