"""``memest estimate`` end to end: tables, JSON, what-if, startup plan, and refused input."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from memest.cli import main
from memest.units import GiB, MiB
from tests.unit.estimate.conftest import PLAN_G2, report_dict


def _write(tmp_path: Path, data: dict[str, Any], name: str = "report.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--from", str(_write(tmp_path, report_dict()))]) == 0
    out = capsys.readouterr().out
    # non-KV 22.812 GiB of which 2.000 GiB graphs: the column holds what is not graphs
    assert "| memest | 2.000 | 20.812 | 67.188 | 550,400 | +0.000 |" in out
    assert "| measured |" in out
    assert f"--kv-cache-memory-bytes={68_800 * MiB}" in out


def test_json_with_grid_and_startup_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _write(tmp_path, report_dict())
    grid = _write(tmp_path, PLAN_G2, "grid.json")
    plans = tmp_path / "cache" / "startup_plan"
    code = main(
        [
            "estimate",
            "--from",
            str(report),
            "--grid",
            str(grid),
            "--json",
            "--write-startup-plan",
            str(plans),
            "--create-dir",
        ]
    )
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["kv_cache_memory_bytes"] == 68_800 * MiB
    estimators = [r["estimator"] for r in payload["comparison"]["records"]]
    assert estimators == ["vllm", "memest", "measured"]
    assert payload["what_if"]["dominant_owner"] == "draft_logits"
    written = json.loads((plans / "startup_plan_0123456789abcdef.json").read_text())
    assert written == {
        "schema": 1,
        "fingerprint": "0123456789abcdef",
        "kv_cache_memory_bytes": 68_800 * MiB,
        "free_memory_baseline": 99 * GiB,
    }


def test_inline_grid_of_plan_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # (512 seqs off SM100 would need 168 GiB of non-KV memory on this 90 GiB budget: refused)
    grid = '{"sm100": false, "max_num_seqs": 128, "max_num_batched_tokens": 4096}'
    assert main(["estimate", "--from", str(_write(tmp_path, report_dict())), "--grid", grid]) == 0
    assert "Dominant change" in capsys.readouterr().out


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert main(["estimate", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    return lines[0]


def test_missing_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = report_dict()
    data["phases"] = [p for p in data["phases"] if p["name"] != "profile_run"]
    err = _refused(tmp_path, capsys, ["--from", str(_write(tmp_path, data))])
    assert "phase 'profile_run' is missing" in err


def test_other_schema_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = report_dict()
    data["schema_version"] = "2"
    err = _refused(tmp_path, capsys, ["--from", str(_write(tmp_path, data))])
    assert "schema_version '2'" in err


def test_negative_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = report_dict()
    data["phases"][0]["end"]["torch_allocated_bytes"] = -5
    err = _refused(tmp_path, capsys, ["--from", str(_write(tmp_path, data))])
    assert "phases.0.end.torch_allocated_bytes" in err


def test_grid_failing_plan_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = dict(PLAN_G2, total_graphs=3)
    args = ["--from", str(_write(tmp_path, report_dict())), "--grid", json.dumps(grid)]
    err = _refused(tmp_path, capsys, args)
    assert "--grid total_graphs=3" in err


def test_startup_plan_needs_worker_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = report_dict()
    data["estimate"]["startup_plan"] = None
    args = ["--from", str(_write(tmp_path, data)), "--write-startup-plan", str(tmp_path)]
    err = _refused(tmp_path, capsys, args)
    assert "estimate.startup_plan" in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, capsys, ["--from", str(tmp_path / "nope.json")])
    assert "nope.json" in err


def test_startup_plan_folder_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "$VLLM_CACHE_ROOT/startup_plan" with the variable unset is "/startup_plan".
    missing = tmp_path / "unset" / "startup_plan"
    args = ["--from", str(_write(tmp_path, report_dict())), "--write-startup-plan", str(missing)]
    err = _refused(tmp_path, capsys, args)
    assert "does not exist" in err and "--create-dir" in err
    assert not missing.exists()
    assert main(["estimate", *args, "--create-dir"]) == 0
    assert len(list(missing.glob("startup_plan_*.json"))) == 1


REAL = Path(__file__).resolve().parents[2] / "tests/data/starts"
S = REAL / "call9.S_llama8b_s128_t4096.apply.report.rank0.json"
LLAMA_CONFIG = Path(__file__).resolve().parents[2] / "examples/llama8b.config.json"


def test_the_inverse_alone_prints_no_what_if(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--from", str(S), "--kv-tokens", "100000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "what_if" not in out and "kv_cache_memory_bytes_to" not in out
    assert out["inverse"]["kv_tokens"] == 100_000
    assert 0 < out["inverse"]["gpu_memory_utilization"] < 1
    assert main(["estimate", "--from", str(S), "--concurrency", "10"]) == 0
    text = capsys.readouterr().out
    assert "What-if" not in text and "Dominant change" not in text
    assert "40,960 KV tokens need gpu_memory_utilization" in text


def test_an_unchanged_grid_has_no_dominant_change(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--from", str(S), "--grid", "{}"]) == 0
    text = capsys.readouterr().out
    assert "What-if" in text and "Dominant change" not in text
    # Full-initialization terms carry the labels the what-if table uses.
    assert "activation headroom" in text and "profile_peak_activation" not in text


def test_inverse_errors_name_the_flag_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(tmp_path, capsys, ["--from", str(S), "--concurrency", "100000"])
    assert err.startswith("memest estimate: invalid configuration: --concurrency=100000:")
    err = _refused(tmp_path, capsys, ["--from", str(S), "--kv-tokens", "999999999"])
    assert "--kv-tokens=999999999:" in err


def test_max_model_len_in_the_grid(capsys: pytest.CaptureFixture[str]) -> None:
    # Past the start's own length the model's positions decide: its config.json says them.
    grid = ["--grid", '{"max_model_len": 8192}', "--model-config", str(LLAMA_CONFIG)]
    assert main(["estimate", "--from", str(S), *grid, "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    assert w["max_model_len_to"] == 8192 and "max_model_len 8192" in w["grid_to"]
    assert w["concurrency_to"] == w["kv_tokens_to"] / 8192
    assert main(["estimate", "--from", str(S), *grid]) == 0
    assert "at 4,096 -> " in capsys.readouterr().out
    assert main(["estimate", "--from", str(S), "--grid", '{"max_model_len": 8192}']) == 2
    assert "max_position_embeddings is not known" in capsys.readouterr().err
    assert (
        main(
            [
                "estimate",
                "--from",
                str(S),
                "--grid",
                '{"max_model_len": 131072}',
                "--model-config",
                str(LLAMA_CONFIG),
            ]
        )
        == 2
    )
    assert "max_position_embeddings 8192" in capsys.readouterr().err


E_REPORT = (
    Path(__file__).resolve().parents[2]
    / "tests/data/starts/call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"
)


#: E on its H200 (150,109,880,320 B, reports/vllm/validation.json, call 8 memest-apply): at
#: serving's first full-size step it used budget - 27,695,514 B, of which 112,807,968,768 B KV, so
#: everything but the KV cache held 132,096,694,682 - 27,695,514 - 112,807,968,768
#: = 19,261,030,400 B = 17.938 GiB. The budget at utilization 0.88 is ceil(0.88 x 150,109,880,320)
#: = 132,096,694,682 B = 123.025 GiB; at 0.01 it is 1,501,098,804 B = 1.398 GiB.
E_MEASURED_NON_KV_GIB = 19_261_030_400 / GiB
E_BUDGET_GIB = {0.88: 132_096_694_682 / GiB, 0.01: 1_501_098_804 / GiB}
DOES_NOT_FIT = re.compile(r"does not fit: non-KV ([\d.]+) GiB > budget ([\d.]+) GiB")


@pytest.mark.parametrize(
    ("args", "margin_gib", "utilization"),
    [
        (["--grid", '{"gpu_memory_utilization": 0.01}'], 0, 0.01),
        (["--margin", "200GiB"], 200, 0.88),
    ],
)
def test_a_what_if_that_cannot_hold_a_kv_cache_says_by_how_much(
    args: list[str], margin_gib: int, utilization: float, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--from", str(E_REPORT), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    found = DOES_NOT_FIT.search(err)
    assert found is not None, err
    non_kv, budget = (float(g) for g in found.groups())
    assert budget == round(E_BUDGET_GIB[utilization], 3)
    # memest's non-KV terms of E against what E measured without its KV cache (within 0.05 GiB),
    # plus the margin asked for
    assert abs(non_kv - margin_gib - E_MEASURED_NON_KV_GIB) < 0.05


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--grid", "notjson"], "--grid 'notjson': neither inline JSON"),
        (["--grid", "[1, 2]"], "--grid: expected a JSON object"),
    ],
)
def test_a_bad_grid_is_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--from", str(E_REPORT), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1
