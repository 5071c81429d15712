"""The H200 DSA start (call 33, S_dsv32_4l_s64_t2048, memest apply with the allocator history
kept): every allocation its captured stages charge has a named owner, and each owner's requests
have the sizes vLLM 0.33.0's DeepSeek-V3.2 code gives them at the widest PIECEWISE graph.

Data: tests/data/starts/call33.*, copied unchanged from reports/vllm/raw/. Expected sizes come
from the model's config.json and the source lines the owner rules name (memest.analysis.owners),
worked by hand, never from the analysis under test.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from lab.dsa_standins import ROW_CHUNK
from lab.vllm_runs import LAB_MODELS
from memest.analysis import analyze
from memest.schema import Breakdown, RunReport
from memest.snapshot import load_snapshot

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"
RUN = "call33.S_dsv32_4l_s64_t2048.apply-hist"
REPORT = RunReport.model_validate_json((STARTS / f"{RUN}.report.rank0.json").read_text())
SNAPSHOT = STARTS / f"{RUN}.snapshot.rank0.json.gz"
MODEL = json.loads((LAB_MODELS / "dsv32_4l" / "config.json").read_text())
BF16, FP8, INT64 = 2, 1, 8


@cache
def _breakdown() -> Breakdown:
    return analyze(load_snapshot(SNAPSHOT))


def _rows(owner: str) -> list[tuple[str, str, int, int]]:
    return [
        (t.phase, t.stage, t.count, t.requested_bytes)
        for t in _breakdown().triggers
        if t.owner == owner
    ]


def test_every_captured_allocation_has_a_named_owner() -> None:
    owners = {t.owner for t in _breakdown().triggers}
    assert owners and not [o for o in owners if o.startswith(("unattributed", "compiled_piece"))]


def test_owner_requests_follow_the_model_at_the_widest_piecewise_graph() -> None:
    tokens = REPORT.config.max_cudagraph_capture_size
    assert tokens == 128
    heads = MODEL["num_attention_heads"]
    # attention.py:424, ql_nope = bmm(q_nope, W_UK^T): [tokens, heads, kv_lora_rank] BF16, the
    # latent query the sparse MQA attend reads (two requests: the bmm's output and its copy)
    latent_q = tokens * heads * MODEL["kv_lora_rank"] * BF16
    # fused_embed_norm.py:131, the gathered embedding rows: [tokens, hidden] BF16
    embedding = tokens * MODEL["hidden_size"] * BF16
    # deepseek_v2.py:935, the fused A-projection: [tokens, q_lora + kv_lora + rope] BF16
    qkv_a = (
        tokens * (MODEL["q_lora_rank"] + MODEL["kv_lora_rank"] + MODEL["qk_rope_head_dim"]) * BF16
    )
    # kernels.py:1052, fused_q's index_q_fp8: [tokens, index heads, index head dim] FP8
    index_q = tokens * MODEL["index_n_heads"] * MODEL["index_head_dim"] * FP8
    for phase in ("graph_profiling", "capture"):
        want = {
            "mla_decode": (phase, "target.piecewise", 2, 2 * latent_q),
            "embedding": (phase, "target.piecewise", 1, embedding),
            "qkv_proj": (phase, "target.piecewise", 1, qkv_a),
            "indexer_q": (phase, "target.piecewise", 1, index_q),
            # the FULL decode graphs' top-k over the indexer's logits: the stand-in's torch.topk
            # indices and their offset copy, [ROW_CHUNK rows, index_topk] int64 each
            "indexer_topk": (phase, "target.full", 2, 2 * ROW_CHUNK * MODEL["index_topk"] * INT64),
        }
        for owner, row in want.items():
            assert row in _rows(owner), owner
    assert (latent_q, embedding, qkv_a, index_q) == (16 << 20, 1_835_008, 540_672, 1 << 20)
