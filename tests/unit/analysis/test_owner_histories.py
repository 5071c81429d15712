"""Owners of real H200 starts under torch.compile (reports/vllm/owners): the committed allocator
histories, analysed on the CPU.

Expected sizes come from each model's config.json and the start's capture plan here, never from
the code under test: an owner's live peak during a capture stage is a whole number of its buffer
(bytes per token x the stage's widest capture size in tokens).
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from memest.analysis import analyze
from memest.reporters.owners import owner_label
from memest.schema import Breakdown, RunReport
from memest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[3]
OWNERS = ROOT / "reports" / "vllm" / "owners"
COLD = "call11.A_llama8b_s128_t4096.enable-cold"
WARM = "call13.A_llama8b_s128_t4096.enable"
EAGLE3 = "call13.C_llama8b_eagle3k3_s64_t4096.enable"
MOE = "call14.M_qwen3moe8l_s64_t2048.apply-hist-cold-stephist"
NO_MAP = "call12.Q_qwen3_8b12l_s64_t2048.apply-hist"
LLAMA = ROOT / "tests" / "data" / "configs" / "llama8b.json"
CONFIGS = {
    COLD: (LLAMA, None),
    WARM: (LLAMA, None),
    EAGLE3: (LLAMA, ROOT / "tests" / "data" / "configs" / "eagle3_8b.json"),
    MOE: (ROOT / "lab" / "models" / "qwen3moe_8l" / "config.json", None),
}
UNNAMED = ("compiled_piece", "unattributed")


@cache
def _start(run: str) -> tuple[RunReport, Breakdown]:
    report = RunReport.model_validate_json((OWNERS / run / "report.rank0.json").read_text())
    return report, analyze(load_snapshot(OWNERS / run / "snapshot.rank0.json.gz"))


def _named_share(rows: list[tuple[str, int]]) -> float:
    total = sum(b for _, b in rows)
    assert total > 0
    return sum(b for o, b in rows if not o.startswith(UNNAMED)) / total


@pytest.mark.parametrize("run", [COLD, WARM, EAGLE3, MOE])
def test_capture_pool_growth_and_retained_bytes_are_charged_to_named_owners(run: str) -> None:
    _, bd = _start(run)
    growth = [(t.owner, t.bytes) for t in bd.triggers if t.phase == "capture"]
    retained = [(r.owner, r.bytes) for r in bd.retained if r.phase == "capture"]
    assert _named_share(growth) >= 0.95
    assert _named_share(retained) >= 0.95


def _owner_table(bd: Breakdown) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for t in bd.triggers:
        if t.phase == "capture":
            out[t.owner] += t.bytes
    for r in bd.retained:
        if r.phase == "capture":
            out[f"retained:{r.owner}"] += r.bytes
    return dict(out)


def test_a_cold_and_a_warm_start_of_one_configuration_give_the_same_owner_table() -> None:
    cold, warm = _start(COLD)[1], _start(WARM)[1]
    assert _owner_table(cold) == _owner_table(warm)
    peaks = {(p.stage, p.owner, p.peak_bytes) for p in cold.live_peaks if p.phase == "capture"}
    assert peaks == {
        (p.stage, p.owner, p.peak_bytes) for p in warm.live_peaks if p.phase == "capture"
    }


def _per_token(cfg: dict[str, Any], owner: str) -> int | None:
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg.get("intermediate_size")
    concat = 2 if any("Eagle3" in a for a in cfg["architectures"]) else 1
    laws = {
        "qkv_proj": (heads + 2 * kv_heads) * head_dim * 2,
        "attn_output": heads * head_dim * 2,
        "o_proj": hidden * 2,
        "graph_output": hidden * 2,
        "qkv_input": concat * hidden * 2,
    }
    if inter and not cfg.get("num_experts"):
        laws |= {"mlp_gate_up": 2 * inter * 2, "mlp_act": inter * 2, "mlp_down": hidden * 2}
    return laws.get(owner)


def _widest_tokens(report: RunReport) -> dict[str, int]:
    plan = next(p for p in report.capture_plans if p.sizing == "vllm-0.33.0")
    return {r.runner: r.widest_tokens for r in plan.runners}


@pytest.mark.parametrize("run", [COLD, EAGLE3, MOE])
def test_large_owners_are_whole_numbers_of_their_config_sized_buffer(run: str) -> None:
    report, bd = _start(run)
    target, drafter = CONFIGS[run]
    cfgs = {"target": json.loads(target.read_text())}
    cfgs["draft"] = json.loads(drafter.read_text()) if drafter else cfgs["target"]
    widest = _widest_tokens(report)
    checked = 0
    for p in bd.live_peaks:
        if p.phase != "capture" or p.peak_bytes < (1 << 20):
            continue
        if p.owner == "cublas_workspace":
            # torch's cuBLAS workspace on sm90: CUBLAS_WORKSPACE_CONFIG ":4096:8", 8 x 4096 KiB
            assert p.peak_bytes == 8 * 4096 * 1024, p
            checked += 1
            continue
        per_token = _per_token(cfgs[p.stage.split(".", 1)[0]], p.owner)
        if per_token is None:
            continue
        buffer = per_token * widest[p.stage]
        ratio = p.peak_bytes / buffer
        # within one allocator rounding (512 B per buffer) of a whole number of buffers
        assert round(ratio) >= 1 and abs(p.peak_bytes - round(ratio) * buffer) <= 512 * round(
            ratio
        ), (p, buffer, ratio)
        checked += 1
    assert checked >= 4


def test_a_start_whose_code_was_compiled_without_memest_says_why_and_how() -> None:
    _, bd = _start(NO_MAP)
    owners = {t.owner for t in bd.triggers if t.phase == "capture"}
    assert "compiled_piece:no module map recorded" in owners
    label = owner_label("compiled_piece:no module map recorded")
    assert "without memest" in label and "cold compile cache" in label
    assert "MEMEST_CODE_MAP_DIR" in label
