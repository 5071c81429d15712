"""MLA's buffers by name on a real start: DeepSeek-V2-Lite (8 layers) under vLLM 0.33.0 on an H200.

The kept allocator history of reports/vllm/raw/call12 (TRITON_MLA decode, the CPU SDPA prefill
backend the lab forces): no allocation made in vLLM's MLA layer or backends stays unattributed,
and the chunked-prefill workspace the builder keeps and the profile pass's stand-in for
kv_b_proj's output over it hold the same rows at the widths config.json gives.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from memest.analysis import analyze
from memest.schema import Breakdown
from memest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "reports/vllm/raw/call12.L_dsv2lite8l_s64_t2048.apply-hist.snapshot.rank0.json.gz"
CONFIG = json.loads((ROOT / "lab/models/dsv2lite_8l/config.json").read_text())
MLA_FILES = ("mla_attention.py", "/mla/")


@cache
def _breakdown() -> Breakdown:
    return analyze(load_snapshot(RUN))


def test_no_allocation_of_the_mla_layer_or_its_backends_is_unattributed() -> None:
    bd = _breakdown()
    owners = {p.owner for p in bd.live_peaks}
    assert {"mla_prefill_workspace", "mla_prefill", "mla_decode"} <= owners
    left = [o for o in owners if o.startswith("unattributed:") and any(f in o for f in MLA_FILES)]
    # the metadata builder's small CPU-sized tensors are the only MLA frames left unnamed
    assert all("build (" in o for o in left), left


def test_both_prefill_workspaces_hold_the_same_rows_at_the_configs_widths() -> None:
    """The builder keeps rows of one latent (kv_lora_rank + qk_rope_head_dim); the profile
    pass's stand-in holds the same rows expanded to heads x (qk_nope_head_dim + v_head_dim)."""
    peaks = {
        p.phase: p.peak_bytes for p in _breakdown().live_peaks if p.owner == "mla_prefill_workspace"
    }
    latent = (CONFIG["kv_lora_rank"] + CONFIG["qk_rope_head_dim"]) * 2
    expanded = (
        CONFIG["num_attention_heads"] * (CONFIG["qk_nope_head_dim"] + CONFIG["v_head_dim"]) * 2
    )
    kept, placeholder = peaks["kv_cache_alloc"], peaks[""]
    assert kept % latent == 0 and placeholder % expanded == 0
    assert kept // latent == placeholder // expanded
