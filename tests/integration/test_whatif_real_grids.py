"""The what-if against real vLLM starts: one H200 start of A predicts four grids, each started.

A (Llama-8B shape, 128 seqs, 4,096 batched tokens) was started with memest on and its allocator
history kept; each G' was then started on the same H200 with memest apply sizing its KV cache
(reports/vllm/raw, calls 11 and 14; lab/whatif_grids.py writes reports/vllm/whatif.json). The
truth comes from the G' starts' own measurements, never from the what-if: the KV that fills the
budget exactly = measured KV bytes - measured usage minus budget at serving's first full-size
step (the harness's record), and each capture stage's pool from G''s own report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memest.cli import main
from memest.units import GiB

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "reports" / "vllm" / "raw"
A = RAW / "call11.A_llama8b_s128_t4096.enable-cold"
DRAFTER = ROOT / "examples" / "eagle3_8b.config.json"
CASES = [
    ({"max_num_seqs": 32}, "call11", "W1_llama8b_s32_t4096", "apply"),
    ({"max_num_batched_tokens": 8192}, "call14", "W2_llama8b_s128_t8192", "apply-cold"),
    (
        {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3}},
        "call11",
        "W3_llama8b_eagle3k3_s128_t4096",
        "apply",
    ),
    (
        {"compilation_config": {"max_cudagraph_capture_size": 64}},
        "call11",
        "W4_llama8b_s128_t4096_cap64",
        "apply",
    ),
]


def _record(call: str, config: str, mode: str) -> dict[str, Any]:
    for line in (RAW / f"results.{call}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["config"] == config and rec["mode"] == mode:
            return dict(rec)
    raise AssertionError(f"no start {config}/{mode} in {call}")


def _estimate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["estimate", *args, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("replay", [False, True], ids=["laws", "allocator-replay"])
@pytest.mark.parametrize(("grid", "call", "config", "mode"), CASES, ids=[c[2] for c in CASES])
def test_kv_budget_and_pools_of_the_real_grid(
    grid: dict[str, Any],
    call: str,
    config: str,
    mode: str,
    replay: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--from", f"{A}.report.rank0.json", "--grid", json.dumps(grid)]
    if "speculative_config" in grid:
        args += ["--drafter-config", str(DRAFTER)]
    if replay:
        args += ["--snapshot", f"{A}.snapshot.rank0.json.gz"]
    what_if = _estimate(capsys, *args)["what_if"]

    rec = _record(call, config, mode)
    # the truth needs a full-size step: max_num_batched_tokens - 1 prompt tokens in one step
    assert rec["step_tokens"] == grid.get("max_num_batched_tokens", 4096) - 1
    exact_kv = rec["kv_bytes"] - rec["step_usage_minus_budget_bytes"]
    # these starts ran no full-batch step: serving's with prompt logprobs takes one more
    # 1,024-row chunk of 128,256 bf16 logits, a 252 MiB segment unless the forward's widest
    # freed block (gate_up, max_num_batched_tokens x 28,672 x 2 B) holds it (calls 48-49
    # measured that 0.246 GiB on Llama-8B at 4,096 tokens)
    mbt = grid.get("max_num_batched_tokens", 4096)
    exact_kv -= 0 if mbt * 28672 * 2 >= 1024 * 128256 * 2 else 252 << 20
    assert abs(what_if["kv_budget_bytes_to"] - exact_kv) <= 0.1 * GiB

    real = RAW / f"{call}.{config}.{mode}.report.rank0.json"
    measured = _estimate(capsys, "--from", str(real))["accounting"]["graph_pool_by_stage_bytes"]
    predicted: dict[str, int] = {}
    for row in what_if["owners"]:
        if row["stage"] != "capture":  # graph objects live outside the pools
            predicted[row["stage"]] = predicted.get(row["stage"], 0) + row["predicted_bytes"]
    assert set(measured) <= set(predicted) | {s for s, b in measured.items() if b == 0}
    for stage, b in measured.items():
        assert abs(predicted.get(stage, 0) - b) <= 0.05 * b, stage


def test_adding_the_drafter_reads_the_cublas_workspace_by_either_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A's report (analysed on the device before the block was named) calls the capture
    stream's cuBLAS workspace compiled_piece:<reason>; today's rules call it cublas_workspace.
    Both reports must give the drafter the same workspaces, so the same KV budget."""
    data = json.loads(Path(f"{A}.report.rank0.json").read_text())
    renamed = 0
    for row in data["breakdown"]["retained"]:
        if row["owner"].startswith("compiled_piece:"):
            row["owner"] = "cublas_workspace"
            renamed += 1
    assert renamed
    relabelled = tmp_path / "report.json"
    relabelled.write_text(json.dumps(data))
    grid = json.dumps(CASES[2][0])
    common = ["--grid", grid, "--drafter-config", str(DRAFTER)]
    before = _estimate(capsys, "--from", f"{A}.report.rank0.json", *common)["what_if"]
    after = _estimate(capsys, "--from", str(relabelled), *common)["what_if"]
    assert after["kv_budget_bytes_to"] == before["kv_budget_bytes_to"]
    assert after["terms_to"]["runner_buffer_bytes"] > after["terms_from"]["runner_buffer_bytes"]


def test_an_moe_report_without_expert_dimensions_says_the_workspace_is_not_moved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Qwen3-MoE start of call 14 recorded no expert dimensions (the plugin records them
    since): the what-if says the fused-MoE workspace stays at G's bytes, and with the model's
    config.json it moves instead."""
    moe = RAW / "call14.M_qwen3moe8l_s64_t2048.apply-hist-cold-stephist.report.rank0.json"
    grid = ["--grid", json.dumps({"max_num_batched_tokens": 4096})]
    alone = _estimate(capsys, "--from", str(moe), *grid)["what_if"]
    assert any("FUSED-MOE WORKSPACE NOT MOVED" in n for n in alone["notes"])
    config = ROOT / "lab" / "models" / "qwen3moe_8l" / "config.json"
    given = _estimate(capsys, "--from", str(moe), *grid, "--model-config", str(config))["what_if"]
    assert not any("FUSED-MOE" in n for n in given["notes"])
    residue = (
        given["terms_to"]["profiling_residue_bytes"]
        - given["terms_from"]["profiling_residue_bytes"]
    )
    assert residue > 0
