"""Command-line input and output edges: usage errors in one line, a closed pipe, folders and
inline JSON named, memest check's default estimator, plan's labels, serve's refusals."""

from __future__ import annotations

import bisect
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memest.cli import build_parser, main
from memest.errors import CommandError
from memest.files import load_json_object

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "tests/data/starts"
S_ENABLE = RAW / "call9.S_llama8b_s128_t4096.enable.report.rank0.json"
S_APPLY = RAW / "call9.S_llama8b_s128_t4096.apply.report.rank0.json"


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", _commands())
def test_every_command_prints_a_usage_error_in_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--no-such-flag"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()  # a missing required argument, or the unknown flag
    assert line.startswith(f"memest {command}: ") and line.endswith(
        f"(see memest {command} --help)"
    )
    assert "usage:" not in captured.err


def test_a_bad_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--from", str(S_APPLY), "--kv-tokens", "abc"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--kv-tokens" in line and "'abc'" in line


def test_a_value_read_as_a_flag_says_how_to_write_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--from", str(S_APPLY), "--margin", "-5GiB"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--margin" in line and "--flag=VALUE" in line
    assert main(["estimate", "--from", str(S_APPLY), "--margin=-5GiB"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--margin" in line and "negative" in line


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    # `memest plan --json | head -1`: the reader closes the pipe after one line
    proc = subprocess.Popen(
        [sys.executable, "-m", "memest", "plan", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == b"{"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert err == ""


def test_a_folder_given_as_a_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(tmp_path), "--min-kv-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"memest check: {tmp_path}: not a regular file (a folder)\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("notjson", "neither inline JSON"),
        ("[1, 2]", "expected a JSON object {...}, got an array"),
        ('"x"', "got a string"),
        ("{bad", "invalid or truncated JSON"),
    ],
)
def test_inline_json_objects_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(CommandError) as err:
        load_json_object("--grid", text, error=CommandError)
    assert str(err.value).startswith("--grid") and needle in str(err.value)


def test_json_object_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    path.write_text('{"max_num_seqs": 64}')
    assert load_json_object("--grid", str(path), error=CommandError) == {"max_num_seqs": 64}


def _report_error(path: Path, estimator: str) -> int:
    """usage minus budget of one record, read from the raw report's accounting records."""
    from memest.estimate import account
    from memest.files import load_report

    rec = account(load_report(path)).estimator(estimator)
    assert rec is not None and rec.usage_minus_budget_bytes is not None
    return rec.usage_minus_budget_bytes


def test_check_auto_takes_the_estimator_that_sized_the_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the enable start: vLLM sized the KV cache and the start ran +0.91 GiB over its budget
    assert main(["check", str(S_ENABLE), "--max-estimate-error", "0.25GiB"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL  estimate error (vllm, sized this start)")
    assert _report_error(S_ENABLE, "vllm") > (1 << 30) * 0.85
    # the apply start: memest sized it, within a few MiB
    assert main(["check", str(S_APPLY), "--max-estimate-error", "0.25GiB"]) == 0
    assert capsys.readouterr().out.startswith("PASS  estimate error (memest, sized this start)")
    # naming an estimator still checks that one
    assert (
        main(["check", str(S_ENABLE), "--max-estimate-error", "0.25GiB", "--estimator", "memest"])
        == 0
    )
    capsys.readouterr()


def test_check_refuses_a_negative_token_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(S_APPLY), "--min-kv-tokens", "-5"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--min-kv-tokens" in line and ">= 0" in line


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--compilation-config", '{"foo": 1}'], "compilation_config.foo"),
        (["--max-num-seqs", "99999999999999999999999"], "max_num_seqs"),
        (
            ["--gpu", "h200", "--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
            ">= max_num_seqs",
        ),
    ],
)
def test_plan_refuses_what_vllm_refuses(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, out, err = _plan(capsys, *args)
    assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1


def test_plan_accepts_vllm_compile_settings_and_says_what_reads_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _plan(
        capsys,
        "--gpu",
        "h200",
        "--compilation-config",
        '{"max_prefill_cudagraph_capture_tokens": 256, "backend": "inductor"}',
    )
    assert code == 0
    first = out.splitlines()[0]
    assert "max_prefill_cudagraph_capture_tokens=256 (read by seed)" in first
    assert 'backend="inductor" (read by neither)' in first and "changes the seed plan" in first
    code, out, _ = _plan(
        capsys, "--compilation-config", '{"max_prefill_cudagraph_capture_tokens": 8192}'
    )
    assert "changes neither plan" in out.splitlines()[0]  # GB200's default is 8192 already


def test_plan_padding_is_labelled_over_graphed_steps_and_all_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--gpu", "h200", "--prefill-batches", "uniform:1-8192"]
    _, out, _ = _plan(capsys, *args, "--json")
    doc = json.loads(out)
    sizes = next(r for r in doc["vllm-0.33.0"]["runners"] if r["runner"] == "target.piecewise")[
        "sizes"
    ]
    # every step size 1..8192 equally likely; those above the widest graph run unpadded
    real = pad = graphed_real = 0
    for n in range(1, 8193):
        real += n
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes):
            pad += sizes[i] - n
            graphed_real += n
    _, out, _ = _plan(capsys, *args)
    line = next(x for x in out.splitlines() if x.strip().startswith("main  target.piecewise"))
    assert f"padding {pad / graphed_real:.2%} of graphed steps' tokens" in line
    assert f"({pad / real:.2%} of all tokens)" in line
    assert "seed = the five capture fields" in out


def test_serve_refuses_a_database_url_it_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--database-url", "bogus://x", "--exit-after-load"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("memest serve: --database-url bogus://x: ")


def test_serve_refuses_a_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "99999"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "99999" in line and "1-65535" in line


def test_serve_refuses_a_port_in_use_before_its_banner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        url = f"sqlite:///{tmp_path / 'm.db'}"
        assert main(["serve", "--port", str(port), "--database-url", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no banner for a server that cannot start
    (line,) = captured.err.splitlines()
    assert f"cannot listen on 127.0.0.1:{port}" in line


@pytest.mark.parametrize(
    ("grid", "field"),
    [
        ({"max_num_seqs": 9999999}, "max_num_seqs"),
        ({"max_num_seqs": 8192, "max_num_batched_tokens": 4096}, "max_num_seqs"),
        ({"max_model_len": 99999999999}, "max_model_len"),
        ({"compilation_config": {"foo": 1}}, "grid.compilation_config.foo"),
    ],
)
def test_api_what_if_refuses_grids_vllm_refuses(
    grid: dict[str, object], field: str, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from memest.service.app import create_app
    from memest.service.config import Settings

    app = create_app(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'm.db'}", write_token="cli-inputs-write-token"
        )
    )
    headers = {"Authorization": "Bearer cli-inputs-write-token", "Content-Type": "application/json"}
    with TestClient(app) as client:
        r = client.post("/api/v1/reports", content=S_APPLY.read_bytes(), headers=headers)
        assert r.status_code in (200, 201), r.text
        run_id = json.loads(S_APPLY.read_text())["run_id"]
        r = client.post(f"/api/v1/runs/{run_id}/estimate", json={"grid": grid})
        assert r.status_code == 422, r.text
        assert field in json.dumps(r.json())
