"""`memest plan` end to end through memest.cli.main."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memest.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_gb200_defaults_table(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the GB200 preset WHEN planned THEN the seed's and main's PIECEWISE rows sit side by side
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    assert "max_num_seqs 1024 · max_num_batched_tokens 16384" in out
    row = next(line for line in out.splitlines() if line.startswith("target.piecewise"))
    assert row.split()[2:4] == ["1", "39"]
    assert "127,487" in row and "35,335" in row and "83" in row.split()


def test_json_carries_both_plans(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "--spec-method", "dspark", "--num-spec-tokens", "7", "--json", "--gpu", "GB200"
    )
    assert code == 0
    doc = json.loads(out)
    seed = {r["runner"]: r for r in doc["seed"]["runners"]}
    main_ = {r["runner"]: r for r in doc["vllm-0.33.0"]["runners"]}
    assert (
        seed["draft.block.full"]["graph_count"],
        seed["draft.block.full"]["widest_requests"],
    ) == (51, 585)
    assert (
        main_["draft.block.full"]["graph_count"],
        main_["draft.block.full"]["widest_requests"],
    ) == (80, 144)
    assert doc["seed"]["total_graphs"] == 138 and doc["vllm-0.33.0"]["total_graphs"] == 243


def test_off_sm100_defaults_and_av(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--gpu",
        "h200",
        "--spec-method",
        "dspark",
        "--num-spec-tokens",
        "5",
        "--adaptive-verification",
        "--json",
    )
    doc = json.loads(out)
    assert doc["seed"]["max_num_batched_tokens"] == 8192
    av = next(r for r in doc["seed"]["runners"] if r["runner"] == "target.av")
    assert (av["graph_count"], av["widest_tokens"]) == (28, 498)


def test_compilation_config_and_interactivity(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--interactivity",
        "--compilation-config",
        '{"max_prefill_cudagraph_capture_tokens": 8192, "max_decode_cudagraph_capture_requests": 512}',
        "--json",
    )
    doc = json.loads(out)
    rows = {r["runner"]: r for r in doc["seed"]["runners"]}
    assert rows["target.piecewise"]["graph_count"] == 65
    assert rows["target.full"]["widest_requests"] == 512


def test_dynamic_sd_and_padding(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--spec-method",
        "eagle3",
        "--num-spec-tokens",
        "7",
        "--dynamic-sd",
        "[[1, 16, 7], [17, 256, 3], [257, 1024, 1]]",
        "--decode-batches",
        '{"8": 1, "100": 1}',
    )
    assert code == 0
    assert "target.full (K=7)" in out and "target.full (K=3)" in out
    assert "Expected padding per step" in out
    padding = [line for line in out.splitlines() if "seed" in line and "target.full (K=7)" in line]
    assert padding and "real 64.0" in padding[0]  # 8 requests × q=8 on the K=7 tier


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gpu", "a100"], "gpu='a100'"),
        (["--max-num-seqs", "0"], "max_num_seqs=0"),
        (
            ["--spec-method", "medusa", "--num-spec-tokens", "2"],
            "speculative_config.method='medusa'",
        ),
        (["--compilation-config", "{bad"], "compilation_config="),
        (
            ["--compilation-config", '{"decode_cudagraph_capture_request_sizes": [8, 4]}'],
            "decode_cudagraph_capture_request_sizes=[8, 4]",
        ),
        (
            [
                "--compilation-config",
                '{"max_cudagraph_capture_size": 512, "max_decode_cudagraph_capture_requests": 64}',
            ],
            "must not be mixed",
        ),
        (
            ["--compilation-config", '{"max_prefill_cudagraph_capture_tokens": -8}'],
            "max_prefill_cudagraph_capture_tokens=-8",
        ),
        (["--dynamic-sd", "1-16"], "--dynamic-sd="),
        (["--decode-batches", "uniform:9-3"], "batch_sizes"),
        (["--decode-batches", "uniform:1-99999999999"], "HIGH above 1,048,576"),
        (["--prefill-batches", "[" * 5000 + "]" * 5000], "--prefill-batches"),
        (["--dynamic-sd", "[" * 5000 + "]" * 5000], "--dynamic-sd"),
        (["--compilation-config", "[" * 5000 + "]" * 5000], "too deeply nested"),
    ],
)
def test_bad_input_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert named in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_subprocess_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memest", "plan", "--gpu", "h100", "--max-num-seqs", "-1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("memest plan: invalid configuration: max_num_seqs=-1")
    assert "Traceback" not in proc.stderr
