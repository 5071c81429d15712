"""The synthetic trace of a DSpark drafter's FULL block routine against the measured start.

reports/vllm/dspark.md measured, in every one of the 45 draft.block.full graphs of
P_qwen3_8b12l_dspark7_s64_t2048 (Qwen3DSparkModel draft: K = 7, markov_rank 256, draft vocabulary
V = 151,936, BF16), what vLLM 0.33.0's ``DSparkSpeculator._sample_sequential`` allocates:

- ``draft_logits``: the lm_head over all K positions, R x K x V x 2 B, once per graph
  (129.8 MiB at R = 64: 64 x 7 x 151,936 x 2 = 136,134,656 B);
- ``draft_logits.markov_bias`` and ``draft_logits.step``: R x V x 2 B each, K of each per graph,
  two alive at once (37.1 MiB at R = 64: 2 x 19,447,808 B);
- ``draft_sample_hidden``: R x K x hidden x 2 B (3.5 MiB at R = 64: 64 x 7 x 4,096 x 2).

The request counts R of the 45 graphs are test_dspark_plan.py's hand derivation.
"""

from __future__ import annotations

import json
from pathlib import Path

from memest.estimate.poolreplay import Graph, PoolRequest
from memest.estimate.synthetic_trace import synthetic_trace
from memest.preflight.predict import request_from, setup
from tests.unit.lab.test_dspark_plan import DRAFT_BLOCK_REQUESTS

ROOT = Path(__file__).resolve().parents[3]
TARGET = json.loads((ROOT / "lab/models/qwen3_8b_12l/config.json").read_text())
DRAFT = json.loads((ROOT / "lab/models/dspark_qwen3_8b_2l/config.json").read_text())
K, V, HIDDEN = 7, 151_936, 4096
#: Measured at R = 64 (reports/vllm/dspark.md, "Owners: the draft logits per draft step").
MEASURED_64 = {
    "draft_logits": 136_134_656,  # 129.8 MiB, one allocation
    "draft_logits.markov_bias": 2 * 19_447_808,  # 37.1 MiB, 2 alive
    "draft_logits.step": 2 * 19_447_808,  # 37.1 MiB, 2 alive
    "draft_sample_hidden": 3_670_016,  # 3.5 MiB
}


def _block_graphs() -> list[Graph]:
    req = request_from(
        {
            "model_config_json": TARGET,
            "draft_model_config": DRAFT,
            "speculative_config": {"method": "dspark", "num_speculative_tokens": K},
            "gpu": "h200",
            "max_num_seqs": 64,
            "max_num_batched_tokens": 2048,
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.85,
        }
    )
    s = setup(req)
    trace = synthetic_trace(
        s.plan, s.target, s.drafter, draft_steps=s.draft_steps, method=s.config.speculative_method
    )
    return trace.stages["draft.block.full"]


def _live_peaks(graph: Graph) -> dict[str, int]:
    live: dict[int, PoolRequest] = {}
    by_owner: dict[str, int] = {}
    peaks: dict[str, int] = {}
    for op in graph.ops:
        if isinstance(op, PoolRequest):
            live[op.handle] = op
            by_owner[op.owner] = by_owner.get(op.owner, 0) + op.size
            peaks[op.owner] = max(peaks.get(op.owner, 0), by_owner[op.owner])
        else:
            gone = live.pop(op)
            by_owner[gone.owner] -= gone.size
    assert not live, "every request of a graph is freed within it"
    return peaks


def test_the_block_routine_has_the_plans_45_graphs() -> None:
    graphs = _block_graphs()
    assert sorted(g.size for g in graphs) == DRAFT_BLOCK_REQUESTS
    assert len(graphs) == 45


def test_every_graph_writes_the_measured_owners() -> None:
    for g in _block_graphs():
        r = g.size
        sizes: dict[str, list[int]] = {}
        for a in g.allocs:
            sizes.setdefault(a.owner, []).append(a.size)
        assert sizes["draft_logits"] == [r * K * V * 2]
        assert sizes["draft_logits.markov_bias"] == [r * V * 2] * K
        assert sizes["draft_logits.step"] == [r * V * 2] * K
        assert sizes["draft_sample_hidden"] == [r * K * HIDDEN * 2]
        assert "gemm_workspace" not in sizes  # the one R x V buffer of before


def test_live_peaks_at_64_requests_are_the_measured_ones() -> None:
    widest = max(_block_graphs(), key=lambda g: g.size)
    assert widest.size == 64
    peaks = _live_peaks(widest)
    assert {k: peaks[k] for k in MEASURED_64} == MEASURED_64
