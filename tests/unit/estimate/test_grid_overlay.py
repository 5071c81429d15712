"""The what-if as documented: --grid names only what changes, vLLM's flag names, drafter kept.

Driven by a real report (Llama-8B shape + EAGLE3 K=5 on an H200, reports/vllm call 8).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memest.cli import main
from memest.errors import ConfigError
from memest.estimate import what_if
from memest.estimate.inverse import largest_max_num_seqs, utilization_for_tokens
from memest.plan.overlay import overlay_config
from memest.schema import RunReport
from memest.units import GiB

REPORT_PATH = (
    Path(__file__).resolve().parents[2]
    / "data/reports/call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"
)


@pytest.fixture(scope="module")
def report() -> RunReport:
    return RunReport.model_validate_json(REPORT_PATH.read_text())


def _runners(result: object) -> set[str]:
    return {p.stage for p in result.owners}  # type: ignore[attr-defined]


def test_one_field_overlays_the_start_and_keeps_its_drafter(report: RunReport) -> None:
    config = overlay_config(report.config, {"max_num_seqs": 512})
    assert config.max_num_seqs == 512
    assert (config.speculative_method, config.num_speculative_tokens) == ("eagle3", 5)
    assert config.max_num_batched_tokens == report.config.max_num_batched_tokens
    assert config.max_model_len == report.config.max_model_len
    result = what_if(report, {"max_num_seqs": 512})
    assert "draft steps FULL: 53 graphs up to 512 tokens" in result.grid_to
    assert result.grid_to.startswith("max_num_seqs 512,")
    # the drafter's pool is predicted, not dropped: its rows carry bytes under G'
    drafter = [p for p in result.owners if p.stage.startswith("draft.")]
    assert drafter and all(p.predicted_bytes > 0 for p in drafter)


def test_report_and_vllm_names_for_the_drafter(report: RunReport) -> None:
    by_report = overlay_config(
        report.config, {"speculative_method": "eagle3", "num_speculative_tokens": 3}
    )
    by_flag = overlay_config(
        report.config,
        {"speculative_config": '{"method": "eagle3", "num_speculative_tokens": 3}'},
    )
    assert by_report.num_speculative_tokens == by_flag.num_speculative_tokens == 3
    dropped = overlay_config(report.config, {"speculative_config": None})
    assert dropped.speculative_method is None and dropped.num_speculative_tokens == 0
    assert "draft" not in what_if(report, {"speculative_config": None}).grid_to


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_seqs": 5}, "grid.max_seqs"),
        ({"speculative_config": {"method": "eagle3", "k": 3}}, "speculative_config.k"),
        ({"speculative_config": "{not json"}, "speculative_config"),
        ({"num_speculative_tokens": -1}, "speculative_config.num_speculative_tokens"),
        (
            {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 0}},
            "speculative_config.num_speculative_tokens",
        ),
        ({"max_num_seqs": 0}, "grid.max_num_seqs"),
        ({"gpu_memory_utilization": 1.5}, "grid.gpu_memory_utilization"),
        ({"compilation_config": [1, 2]}, "compilation_config"),
    ],
)
def test_a_bad_overlay_names_its_field(
    report: RunReport, changes: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        overlay_config(report.config, changes)
    assert err.value.field == field


def test_capture_settings_in_compilation_config(report: RunReport) -> None:
    result = what_if(report, {"compilation_config": {"max_cudagraph_capture_size": 128}})
    assert "target PIECEWISE: 19 graphs up to 128 tokens" in result.grid_to
    assert "up to 512 tokens" not in result.grid_to


def test_utilization_moves_the_budget(report: RunReport) -> None:
    result = what_if(report, {"gpu_memory_utilization": 0.9})
    assert result.terms_from is not None and result.terms_to is not None
    total = report.gpu.total_bytes  # type: ignore[union-attr]
    assert result.terms_to.requested_bytes == math.ceil(0.9 * total)
    assert result.term_laws["requested_bytes"] == "gpu_memory_utilization"
    moved = result.terms_to.requested_bytes - result.terms_from.requested_bytes
    assert result.kv_budget_bytes_to - result.kv_budget_bytes_from == moved  # type: ignore[operator]


def test_utilization_for_tokens_is_the_smallest_that_holds_them(report: RunReport) -> None:
    tokens = 900_000
    util = utilization_for_tokens(report, what_if(report, {}), tokens)
    holds = what_if(report, {"gpu_memory_utilization": util}).kv_tokens_to
    below = what_if(report, {"gpu_memory_utilization": round(util - 0.0001, 4)}).kv_tokens_to
    assert holds is not None and below is not None
    assert holds >= tokens > below


def test_largest_max_num_seqs_that_keeps_n_tokens(report: RunReport) -> None:
    tokens = what_if(report, {"max_num_seqs": 16}).kv_tokens_to
    assert tokens is not None
    seqs = largest_max_num_seqs(report, tokens, what_if)
    assert seqs is not None and seqs >= 16

    def kv(n: int) -> int:
        value = what_if(report, {"max_num_seqs": n}).kv_tokens_to
        assert value is not None
        return value

    assert kv(seqs) >= tokens > kv(seqs + 1)


CONFIGS = Path(__file__).resolve().parents[2] / "data/configs"
#: C's grid (call 6: 64 seqs, EAGLE3 K=3, utilization 0.85) written as changes to E's.
C_GRID = {
    "max_num_seqs": 64,
    "gpu_memory_utilization": 0.85,
    "speculative_config": {"method": "eagle3", "num_speculative_tokens": 3},
}
#: The KV cache that fills C's budget exactly, measured (reports/vllm/validation.json, call 6
#: memest-apply): 108,463,128,576 B of KV with usage 17,055,744 B over the budget at serving's
#: first full-size step, so 108,463,128,576 - 17,055,744 = 108,446,072,832 B.
#: Call 6 ran no full-batch step; serving's with prompt logprobs takes one more 1,024-row chunk
#: of 128,256 bf16 logits, a 252 MiB segment (the Llama-8B starts of calls 48-49 grew 0.246 GiB
#: more in that step than in the first full-size one), so the KV that fits is that much less.
C_EXACT_KV = 108_463_128_576 - 17_055_744 - 252 * 1024 * 1024


def test_cli_prints_the_flag_a_measured_start_at_the_new_grid_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        *("estimate", "--from", str(REPORT_PATH), "--grid", json.dumps(C_GRID)),
        *("--model-config", str(CONFIGS / "llama8b.json")),
        *("--drafter-config", str(CONFIGS / "eagle3_8b.json"), "--json"),
    ]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    # E's flag for C's grid, against what C's own start measured: within the what-if's 0.1 GiB
    error = payload["kv_cache_memory_bytes_to"] - C_EXACT_KV
    assert abs(error) < 0.1 * GiB, error / GiB


def test_cli_inverse_question(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--from", str(REPORT_PATH), "--concurrency", "200", "--json"])
    assert code == 0
    inverse = json.loads(capsys.readouterr().out)["inverse"]
    assert inverse["kv_tokens"] == 200 * 4096
    assert 0 < inverse["gpu_memory_utilization"] <= 1


def test_cli_unknown_grid_field_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--from", str(REPORT_PATH), "--grid", '{"max_seqs": 5}']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_seqs" in err
