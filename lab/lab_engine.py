"""Lab engine: a small engine that starts in vLLM 0.33.0's order with synthetic owners of known size.

It exists for the memory owners real vLLM cannot run on the lent H200 (sparse-indexer logits in
BF16 plus their FP32 copy, DSpark-style draft logits with all-gather-like copies, auxiliary hidden
states retained across PIECEWISE capture sizes) and follows ``Worker`` step by step:

1. init: CUDA context and a cuBLAS handle, then the baseline reading and the budget
   ``ceil(gpu_memory_utilization x total)``;
2. weights;
3. profile run at ``max_num_batched_tokens`` inside vLLM's ``memory_profiling`` arithmetic
   (``total_consumed``, ``transient_peak_headroom``);
4. graph-memory profiling into a throwaway pool, exactly as ``profile_cudagraph_memory``: minimal
   KV cache with the runner buffers, every PIECEWISE and drafter graph, the two widest FULL graphs
   with free-memory samples, ``first + (n - 1) x max(second, 1 MiB)``; with ``--estimator memest``
   a second throwaway pass captures every graph of every stage and records pool reservation per
   stage (memest's full-initialization measurement);
5. KV cache sized by the chosen estimator, with the runner buffers allocated beside it;
6. the real capture into one shared pool, stage by stage (target PIECEWISE, target FULL, drafter),
   widest size first, each capture preceded by an eager warm-up as in ``CudaGraphManager.capture``;
7. the end state after serving's first step at ``max_num_batched_tokens``.

Each start runs in its own process (``--child``); the parent runs every grid with each estimator,
then writes one RunReport JSON per start, the estimate records, the what-if check and a summary.

Pool growth is charged to owners by reading the allocator's reserved bytes around each owner's
allocations inside the capture (only the capture stream allocates then, and only from the graph
pool): the allocation that made the pool grow is charged, as in a trigger table.

Run on the H200 (PYTHONPATH=.:instrumentation, pydantic carried as wheels):
    python3 lab/lab_engine.py --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

MiB = 1 << 20
GiB = 1 << 30

# Synthetic model: shapes are public constants so every owner's size is known in advance.
HIDDEN = 4096
N_AUX = 3  # EAGLE3 / DSpark auxiliary layers
INDEXER_CONTEXT = 65536  # compressed KV positions the indexer scores per row
HEADS_PADDED = 16
ATTN_HEAD_DIM = 512
QROPE_HEAD_DIM = 576
VOCAB = 129280
TP = 4  # draft logits are gathered from TP shards
SPEC_K = 3  # DSpark q = K
TARGET_Q = SPEC_K + 1
WEIGHTS_BYTES = 8 * GiB
KV_LAYERS, KV_HEADS, KV_HEAD_SIZE, KV_DTYPE_BYTES, KV_BLOCK = 32, 8, 128, 2, 16
KV_PAGE_BYTES = KV_LAYERS * 2 * KV_HEADS * KV_HEAD_SIZE * KV_DTYPE_BYTES * KV_BLOCK
MAX_MODEL_LEN = 131072
BF16 = torch.bfloat16
# Overridden only by the CPU smoke test of this script's bookkeeping (tests/unit/estimate).
DEVICE = "cuda"

GRIDS: dict[str, dict[str, int]] = {
    # vLLM 0.33.0 off SM100: cap = min(max_num_seqs x q x 2, 512, max_num_batched_tokens).
    "G": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_cudagraph_capture_size": 512},
    # G': twice the sequences and an explicit max_cudagraph_capture_size of 1024.
    "G2": {
        "max_num_seqs": 512,
        "max_num_batched_tokens": 8192,
        "max_cudagraph_capture_size": 1024,
    },
}
GPU_MEMORY_UTILIZATION = 0.5


# ------------------------------------------------------------------------------------------------
# Capture plans (vLLM 0.33.0's token list; FULL and drafter graphs keyed by requests)
# ------------------------------------------------------------------------------------------------


def plan_for(grid: dict[str, int]) -> dict[str, Any]:
    """The grid's capture plan from memest.plan (vLLM 0.33.0 sizing and descriptors), as JSON."""
    from memest.plan import PlanInput, resolve

    cap = grid["max_cudagraph_capture_size"]
    inp = PlanInput(
        sm100=False,
        max_num_seqs=grid["max_num_seqs"],
        max_num_batched_tokens=grid["max_num_batched_tokens"],
        spec_method="dspark",
        num_speculative_tokens=SPEC_K,
        max_cudagraph_capture_size=None if cap == 512 else cap,
        gpu="h200",
    )
    plan = resolve(inp, "vllm-0.33.0").model_dump(mode="json")
    runners = {r["runner"] for r in plan["runners"]}
    expected = {stage for stage, _ in STAGES}
    if runners != expected:
        raise RuntimeError(f"lab engine captures {sorted(expected)}, plan lists {sorted(runners)}")
    if plan["max_cudagraph_capture_size"] != cap:
        raise RuntimeError(f"plan cap {plan['max_cudagraph_capture_size']} != grid cap {cap}")
    return plan


# ------------------------------------------------------------------------------------------------
# Readings and owner charging
# ------------------------------------------------------------------------------------------------


def reading() -> dict[str, Any]:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    pools: dict[str, int] = {}
    for seg in torch.cuda.memory_snapshot():
        pid = seg.get("segment_pool_id", (0, 0))
        key = f"{pid[0]},{pid[1]}"
        pools[key] = pools.get(key, 0) + int(seg["total_size"])
    return {
        "time_ns": time.monotonic_ns(),
        "device_used_bytes": int(total - free),
        "device_total_bytes": int(total),
        "device_source": "cudaMemGetInfo",
        "torch_reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "torch_allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
        "torch_reserved_peak_bytes": int(stats.get("reserved_bytes.all.peak", 0)),
        "torch_allocated_peak_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
        "pool_reserved_bytes": pools,
    }


def free_bytes() -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


class Charges:
    """Pool growth per (stage, owner), read from reserved bytes around each owner's allocations."""

    def __init__(self) -> None:
        self.active = False
        self.phase = ""
        self.stage = ""
        self.bytes: dict[tuple[str, str, str], int] = {}
        self.count: dict[tuple[str, str, str], int] = {}

    @contextlib.contextmanager
    def owner(self, name: str) -> Iterator[None]:
        if not self.active:
            yield
            return
        before = torch.cuda.memory_reserved()
        yield
        grown = torch.cuda.memory_reserved() - before
        key = (self.phase, self.stage, name)
        if grown > 0:
            self.bytes[key] = self.bytes.get(key, 0) + grown
            self.count[key] = self.count.get(key, 0) + 1


# ------------------------------------------------------------------------------------------------
# The synthetic model
# ------------------------------------------------------------------------------------------------


class Model:
    def __init__(self, grid: dict[str, int], charges: Charges) -> None:
        self.grid = grid
        self.charges = charges
        self.weights = [
            torch.empty(WEIGHTS_BYTES // 8, dtype=torch.uint8, device=DEVICE) for _ in range(8)
        ]
        self.buffers: dict[str, torch.Tensor] = {}

    # Runner buffers allocated with the KV cache (MRV2 initialize_kv_cache): persistent inputs,
    # block tables, drafter hidden states, DSpark aux staging and the probabilistic draft-logits
    # cache. None of them is in vLLM's budget.
    def allocate_runner_buffers(self) -> int:
        t, seqs = self.grid["max_num_batched_tokens"], self.grid["max_num_seqs"]
        shapes = {
            "input_hidden": ((t, HIDDEN), BF16),
            "block_tables": ((seqs, MAX_MODEL_LEN // KV_BLOCK), torch.int32),
            "draft_hidden": ((t, HIDDEN), BF16),
            "dspark_aux_staging": ((min(seqs * TARGET_Q, t), N_AUX * HIDDEN), BF16),
            "draft_logits_cache": ((seqs, SPEC_K, VOCAB), BF16),
        }
        total = 0
        for name, (shape, dtype) in shapes.items():
            buf = torch.zeros(shape, dtype=dtype, device=DEVICE)
            self.buffers[name] = buf
            total += buf.numel() * buf.element_size()
        return total

    def release_runner_buffers(self) -> None:
        self.buffers.clear()

    def x(self, rows: int) -> torch.Tensor:
        return self.buffers["input_hidden"][:rows]

    def piecewise(self, tokens: int, retained: list[torch.Tensor] | None) -> None:
        c = self.charges
        with c.owner("gemm_workspace"):
            ws = torch.empty(tokens, 4 * HIDDEN, dtype=BF16, device=DEVICE)
            ws.fill_(0.5)
        with c.owner("attn_output"):
            out = torch.empty(tokens, HIDDEN, dtype=BF16, device=DEVICE)
            out.copy_(self.x(tokens))
        with c.owner("aux_hidden_states"):
            aux = torch.empty(tokens, N_AUX * HIDDEN, dtype=BF16, device=DEVICE)
            aux[:, :HIDDEN].copy_(out)
        del ws, out
        if retained is not None:
            # Nested output references keep one aux output alive per capture size.
            retained.append(aux)

    def full(self, requests: int) -> None:
        rows = requests * TARGET_Q
        c = self.charges
        with c.owner("qnorm_rope_kv_insert"):
            qp = torch.empty(rows, HEADS_PADDED, QROPE_HEAD_DIM, dtype=BF16, device=DEVICE)
            qp.fill_(0.25)
        with c.owner("indexer_logits_bf16"):
            logits = torch.empty(rows, INDEXER_CONTEXT, dtype=BF16, device=DEVICE)
            logits.fill_(1.0)
        with c.owner("indexer_logits_fp32"):
            logits32 = logits.float()
        with c.owner("attn_output"):
            ao = torch.empty(rows, HEADS_PADDED, ATTN_HEAD_DIM, dtype=BF16, device=DEVICE)
            ao.fill_(0.5)
        del qp, logits, logits32, ao

    def draft(self, requests: int) -> None:
        rows = requests * SPEC_K
        c = self.charges
        with c.owner("attn_output"):
            h = torch.empty(rows, HIDDEN, dtype=BF16, device=DEVICE)
            h.copy_(self.x(rows))
        with c.owner("draft_logits"):
            local = torch.empty(rows, VOCAB // TP, dtype=BF16, device=DEVICE)
            local.fill_(0.1)
            gathered = torch.empty(TP * rows, VOCAB // TP, dtype=BF16, device=DEVICE)
            gathered.fill_(0.2)
            full = torch.empty(rows, VOCAB, dtype=BF16, device=DEVICE)
            full.fill_(0.3)
        del h, local, gathered, full

    def step(self, tokens: int) -> None:
        """One eager forward at ``tokens`` (profile run, serving's first max-size step)."""
        seqs = self.grid["max_num_seqs"]
        ws = torch.empty(tokens, 4 * HIDDEN, dtype=BF16, device=DEVICE)
        ws.fill_(0.5)
        aux = torch.empty(tokens, N_AUX * HIDDEN, dtype=BF16, device=DEVICE)
        aux.fill_(0.5)
        # The profile run reserves the indexer's prefill logits stand-in
        # (VLLM_SPARSE_INDEXER_MAX_LOGITS_MB = 512), not the decode logits of FULL rows.
        stand_in = torch.empty(512 * MiB, dtype=torch.uint8, device=DEVICE)
        stand_in.fill_(1)
        rows = min(seqs * SPEC_K, tokens)
        logits = torch.empty(rows, VOCAB, dtype=BF16, device=DEVICE)
        logits.fill_(0.1)
        torch.cuda.synchronize()
        del ws, aux, stand_in, logits


# ------------------------------------------------------------------------------------------------
# One start
# ------------------------------------------------------------------------------------------------

STAGES = (
    ("target.piecewise", "piecewise"),
    ("target.full", "full"),
    ("draft.block.full", "draft"),
)


def capture_all(
    model: Model,
    plan: dict[str, Any],
    pool: Any,
    graphs: list[torch.cuda.CUDAGraph],
    retained: list[torch.Tensor],
    *,
    full_samples: list[int] | None = None,
    stage_growth: dict[str, int] | None = None,
    stage_graphs: dict[str, int] | None = None,
) -> None:
    """Capture every runner into ``pool`` in vLLM's order, widest size first.

    With ``full_samples``, only the two widest target FULL graphs are captured and each one's
    free-memory delta is recorded as ``CudaGraphManager.capture`` does during profiling.
    """
    runners = {r["runner"]: r for r in plan["runners"]}
    for stage, kind in STAGES:
        row = runners[stage]
        sizes = sorted(row["sizes"], reverse=True)
        if full_samples is not None and stage == "target.full":
            sizes = sizes[:2]
        body: Callable[[int], None]
        if kind == "piecewise":
            body = lambda n: model.piecewise(n, None)  # noqa: E731
            captured_body: Callable[[int], None] = lambda n: model.piecewise(n, retained)  # noqa: E731
        elif kind == "full":
            body = captured_body = model.full
        else:
            body = captured_body = model.draft
        model.charges.stage = stage
        pool_before = _pool_reserved(pool)
        for n in sizes:
            body(n)  # eager warm-up in the default pool
            sample = full_samples is not None and stage == "target.full"
            if sample:
                free_before = free_bytes()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                model.charges.active = True
                try:
                    captured_body(n)
                finally:
                    model.charges.active = False
            if sample and full_samples is not None:
                full_samples.append(free_before - free_bytes())
            graphs.append(graph)
        if stage_growth is not None:
            stage_growth[stage] = _pool_reserved(pool) - pool_before
        if stage_graphs is not None:
            stage_graphs[stage] = len(sizes)


def _pool_reserved(pool: Any) -> int:
    """Reserved bytes of one private pool, from the allocator's segments."""
    total = 0
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool):
            total += int(seg["total_size"])
    return total


def run_start(grid_name: str, estimator: str) -> dict[str, Any]:
    grid = GRIDS[grid_name]
    plan = plan_for(grid)
    from memest.estimate import (
        FullInitTerms,
        full_init_kv_budget,
        vllm_cudagraph_estimate,
    )

    phases: list[dict[str, Any]] = []
    charges = Charges()

    # 1. init_device: context, cuBLAS handle, baseline.
    torch.cuda.init()
    a = torch.randn(16, 16, device=DEVICE)
    (a @ a).sum().item()
    del a
    gc.collect()
    torch.cuda.empty_cache()
    init = reading()
    init_free = init["device_total_bytes"] - init["device_used_bytes"]
    total = init["device_total_bytes"]
    requested = math.ceil(total * GPU_MEMORY_UTILIZATION)
    assert init_free >= requested, "GPU not free enough for the requested budget"

    # 2. weights
    start = reading()
    model = Model(grid, charges)
    phases.append({"name": "weights", "start": start, "end": reading()})
    weights_bytes = phases[-1]["end"]["torch_allocated_bytes"] - start["torch_allocated_bytes"]

    # 3. profile run inside vLLM's memory_profiling arithmetic.
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = reading()
    model.step(grid["max_num_batched_tokens"])
    gc.collect()
    torch.cuda.empty_cache()
    end = reading()
    phases.append({"name": "profile_run", "start": start, "end": end})
    after_free = end["device_total_bytes"] - end["device_used_bytes"]
    total_consumed = init_free - after_free
    headroom = end["torch_allocated_peak_bytes"] - end["torch_allocated_bytes"]
    vllm_non_kv = total_consumed + headroom

    # 4. graph-memory profiling (vLLM's, then memest's full pass when it sizes the KV cache).
    start = reading()
    gc.collect()
    torch.cuda.empty_cache()
    pool = torch.cuda.graph_pool_handle()
    min_blocks = min(grid["max_num_seqs"], grid["max_cudagraph_capture_size"])
    model.allocate_runner_buffers()
    kv_min = torch.zeros(min_blocks * KV_PAGE_BYTES, dtype=torch.int8, device=DEVICE)
    graphs: list[torch.cuda.CUDAGraph] = []
    retained: list[torch.Tensor] = []
    samples: list[int] = []
    torch.cuda.empty_cache()
    cap_start_free = free_bytes()
    charges.phase = "graph_profiling"
    capture_all(model, plan, pool, graphs, retained, full_samples=samples)
    measured = cap_start_free - free_bytes()
    n_full = next(r["graph_count"] for r in plan["runners"] if r["runner"] == "target.full")
    vllm_estimate = vllm_cudagraph_estimate(measured, samples, n_full)
    del graphs, retained, kv_min
    model.release_runner_buffers()
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()

    memest_terms: dict[str, Any] | None = None
    profiling_stages: dict[str, int] = {}
    if estimator == "memest":
        pool = torch.cuda.graph_pool_handle()
        before_buffers = torch.cuda.memory_allocated()
        model.allocate_runner_buffers()
        kv_min = torch.zeros(min_blocks * KV_PAGE_BYTES, dtype=torch.int8, device=DEVICE)
        runner_bytes = max(torch.cuda.memory_allocated() - before_buffers - kv_min.numel(), 0)
        graphs, retained = [], []
        by_stage: dict[str, int] = {}
        charges.phase = "graph_profiling_full"
        capture_all(model, plan, pool, graphs, retained, stage_growth=by_stage)
        profiling_stages = dict(by_stage)
        with_graphs = reading()
        outside = with_graphs["device_used_bytes"] - with_graphs["torch_reserved_bytes"]
        del graphs, retained, kv_min
        model.release_runner_buffers()
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        residue = max(torch.cuda.memory_allocated() - phases[0]["end"]["torch_allocated_bytes"], 0)
        terms = FullInitTerms(
            requested_bytes=requested,
            weights_bytes=weights_bytes,
            profile_peak_activation_bytes=headroom,
            outside_torch_bytes=outside,
            graph_pool_bytes=sum(by_stage.values()),
            graph_pool_by_stage_bytes=by_stage,
            runner_buffer_bytes=runner_bytes,
            profiling_residue_bytes=residue,
            margin_bytes=0,
            baseline_torch_bytes=init["torch_reserved_bytes"],
            source="lab: throwaway capture of every stage",
        )
        memest_terms = terms.model_dump()
    phases.append({"name": "graph_profiling", "start": start, "end": reading()})

    # 5. KV cache sized by the estimator, runner buffers beside it.
    if estimator == "memest":
        kv_budget = full_init_kv_budget(FullInitTerms.model_validate(memest_terms))
    else:
        kv_budget = max(requested - vllm_non_kv - vllm_estimate, 0)
    num_blocks = kv_budget // KV_PAGE_BYTES
    start = reading()
    model.allocate_runner_buffers()
    kv = torch.zeros(num_blocks * KV_PAGE_BYTES, dtype=torch.int8, device=DEVICE)
    phases.append({"name": "kv_cache_alloc", "start": start, "end": reading()})

    # 6. real capture into the shared pool, stage by stage.
    gc.collect()
    torch.cuda.empty_cache()
    start = reading()
    pool = torch.cuda.graph_pool_handle()
    graphs, retained = [], []
    by_stage, graph_counts = {}, {}
    cap_free = free_bytes()
    charges.phase = "capture"
    capture_all(
        model, plan, pool, graphs, retained, stage_growth=by_stage, stage_graphs=graph_counts
    )
    vllm_actual = cap_free - free_bytes()
    phases.append({"name": "capture", "start": start, "end": reading()})

    # 7. serving's first step at max_num_batched_tokens, then the end state.
    start = reading()
    model.step(grid["max_num_batched_tokens"])
    phases.append({"name": "end", "start": start, "end": reading()})
    end = phases[-1]["end"]

    triggers = [
        {"phase": ph, "stage": s, "owner": o, "bytes": b, "count": charges.count[(ph, s, o)]}
        for (ph, s, o), b in sorted(charges.bytes.items())
    ]
    charged = sum(b for (ph, _, _), b in charges.bytes.items() if ph == "capture")
    stages = [
        {"stage": s, "phase": "capture", "pool_growth_bytes": g, "graph_count": graph_counts[s]}
        for s, g in by_stage.items()
    ] + [
        {"stage": s, "phase": "graph_profiling_full", "pool_growth_bytes": g}
        for s, g in profiling_stages.items()
    ]
    cap = phases[-2]
    outside_growth = (cap["end"]["device_used_bytes"] - cap["end"]["torch_reserved_bytes"]) - (
        cap["start"]["device_used_bytes"] - cap["start"]["torch_reserved_bytes"]
    )
    report = {
        "schema_version": "1",
        "run_id": f"lab-{grid_name}-{estimator}",
        "source": "synthetic",
        "model": "lab-engine (synthetic DSpark K=3 owners)",
        "build": {
            "label": f"lab {estimator}",
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
        },
        "gpu": {"name": torch.cuda.get_device_name(), "total_bytes": total},
        "config": {
            "model": "lab-engine",
            "max_num_seqs": grid["max_num_seqs"],
            "max_num_batched_tokens": grid["max_num_batched_tokens"],
            "max_model_len": MAX_MODEL_LEN,
            "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
            "speculative_method": "dspark",
            "num_speculative_tokens": SPEC_K,
            "cudagraph_mode": "FULL_AND_PIECEWISE",
            "max_cudagraph_capture_size": grid["max_cudagraph_capture_size"],
            "model_runner": "lab",
        },
        "capture_plans": [plan],
        "kv_cache": {
            "kind": "full_attention",
            "num_layers": KV_LAYERS,
            "num_kv_heads": KV_HEADS,
            "head_size": KV_HEAD_SIZE,
            "dtype": "bfloat16",
            "dtype_bytes": KV_DTYPE_BYTES,
            "block_size": KV_BLOCK,
            "page_size_bytes": KV_PAGE_BYTES,
            "num_blocks": int(num_blocks),
            "kv_tokens": int(num_blocks * KV_BLOCK),
        },
        "phases": phases,
        "breakdown": {
            "phases": [
                {
                    "phase": "capture",
                    "total_added_bytes": cap["end"]["device_used_bytes"]
                    - cap["start"]["device_used_bytes"],
                    "graph_pool_bytes": sum(by_stage.values()),
                    "other_torch_bytes": (
                        cap["end"]["torch_reserved_bytes"] - cap["start"]["torch_reserved_bytes"]
                    )
                    - sum(by_stage.values()),
                    "outside_torch_bytes": outside_growth,
                }
            ],
            "stages": stages,
            "triggers": triggers,
            "retained": [
                {
                    "stage": "target.piecewise",
                    "owner": "aux_hidden_states",
                    "capture_size": int(t.shape[0]),
                    "bytes": t.numel() * t.element_size(),
                    "count": 1,
                }
                for t in retained
            ],
            "graph_pool_growth_bytes": sum(by_stage.values()),
        },
        "estimate": {
            "vllm_graph_profile": {
                "measured_bytes": measured,
                "full_samples_bytes": samples,
                "full_graph_count": n_full,
            },
        },
        "vllm": {
            "requested_memory_bytes": requested,
            "weights_bytes": weights_bytes,
            "non_kv_cache_memory_bytes": vllm_non_kv,
            "peak_activation_bytes": headroom,
            "cudagraph_estimate_bytes": vllm_estimate,
            "cudagraph_actual_bytes": vllm_actual,
            "available_kv_cache_bytes": max(requested - vllm_non_kv - vllm_estimate, 0),
            "num_gpu_blocks": int(num_blocks),
        },
        "notes": [
            f"estimator that sized this start: {estimator}",
            f"owner charges cover {charged} of {sum(by_stage.values())} pool bytes",
        ],
    }
    lab = {
        "grid": grid_name,
        "estimator": estimator,
        "requested_bytes": requested,
        "baseline_used_bytes": init["device_used_bytes"],
        "kv_budget_bytes": int(kv_budget),
        "kv_allocated_bytes": int(num_blocks * KV_PAGE_BYTES),
        "kv_tokens": int(num_blocks * KV_BLOCK),
        "usage_end_bytes": end["device_used_bytes"],
        "usage_minus_budget_bytes": end["device_used_bytes"] - requested,
        "usage_after_capture_bytes": cap["end"]["device_used_bytes"],
        "vllm_estimate_bytes": vllm_estimate,
        "vllm_actual_bytes": vllm_actual,
        "vllm_samples_bytes": samples,
        "vllm_measured_bytes": measured,
        "memest_terms": memest_terms,
        "pool_by_stage_bytes": by_stage,
        "pool_reserved_by_pool": end["pool_reserved_bytes"],
    }
    del kv, graphs, retained
    return {"report": report, "lab": lab}


# ------------------------------------------------------------------------------------------------
# Summary (CPU): estimates side by side and the what-if check, from the starts' JSON
# ------------------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / GiB:+.3f}" if n < 0 else f"{n / GiB:.3f}"


def _check_what_if(
    report_g: Any, report_g2: Any, starts: dict[tuple[str, str], dict[str, Any]]
) -> dict[str, Any]:
    """Predict G2 from the run under G, and set each owner beside what G2 measured."""
    from memest.estimate import what_if

    prediction = what_if(report_g, report_g2.capture_plans[0])
    measured: dict[tuple[str, str], int] = {}
    bd = report_g2.breakdown
    for t in bd.triggers if bd else []:
        if t.phase == "capture":
            measured[(t.stage, t.owner)] = measured.get((t.stage, t.owner), 0) + t.bytes
    objects = [p.outside_torch_bytes for p in bd.phases if p.phase == "capture"] if bd else []
    measured[("capture", "graph_objects")] = max(objects[0], 0) if objects else 0
    rows = []
    for p in prediction.owners:
        got = measured.get((p.stage, p.owner), 0)
        rows.append(
            {
                "stage": p.stage,
                "owner": p.owner,
                "law": p.law,
                "g_bytes": p.measured_bytes,
                "factor": p.factor,
                "predicted_g2_bytes": p.predicted_bytes,
                "measured_g2_bytes": got,
                "error": (p.predicted_bytes - got) / got if got else None,
                "note": p.note,
            }
        )
    pool_measured = sum(v for (s, _), v in measured.items() if s != "capture")
    memest_g2 = starts.get(("G2", "memest"))
    return {
        "from": "G",
        "to": "G2",
        "rows": rows,
        "graph_pool_predicted_bytes": prediction.graph_pool_bytes_to,
        "graph_pool_measured_bytes": pool_measured,
        "graph_pool_error": (prediction.graph_pool_bytes_to - pool_measured) / pool_measured
        if pool_measured
        else None,
        "kv_budget_predicted_bytes": prediction.kv_budget_bytes_to,
        "kv_budget_memest_g2_bytes": memest_g2["lab"]["kv_budget_bytes"] if memest_g2 else None,
        "dominant_owner": prediction.dominant_owner,
        "dominant_change_bytes": prediction.dominant_change_bytes,
    }


def summarize(src: Path, dst: Path, command: str) -> dict[str, Any]:
    """Write reports/lab: one record per configuration and estimator, the what-if, markdown."""
    from memest.estimate import compare
    from memest.schema import RetainedRow, RunReport

    starts: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(src.glob("start_*.json")):
        data = json.loads(path.read_text())
        starts[(data["lab"]["grid"], data["lab"]["estimator"])] = data
    dst.mkdir(parents=True, exist_ok=True)
    runs = dst / "runs"
    runs.mkdir(exist_ok=True)
    records: list[dict[str, Any]] = []
    for (grid, estimator), data in sorted(starts.items()):
        lab = data["lab"]
        report = RunReport.model_validate(data["report"])
        (runs / f"{grid}_{estimator}.report.json").write_text(report.model_dump_json(indent=1))
        posthoc = compare(report)
        records.append(
            {
                "configuration": grid,
                "grid": GRIDS[grid],
                "estimator": estimator,
                "usage_minus_budget_bytes": lab["usage_minus_budget_bytes"],
                "usage_minus_budget_instance_bytes": lab["usage_minus_budget_bytes"]
                - lab["baseline_used_bytes"],
                "kv_tokens": lab["kv_tokens"],
                "kv_cache_bytes": lab["kv_allocated_bytes"],
                "requested_bytes": lab["requested_bytes"],
                "baseline_used_bytes": lab["baseline_used_bytes"],
                "vllm_graph_estimate_bytes": lab["vllm_estimate_bytes"],
                "vllm_graph_actual_bytes": lab["vllm_actual_bytes"],
                "graph_pool_bytes": sum(lab["pool_by_stage_bytes"].values()),
                "memest_terms": lab["memest_terms"],
                "posthoc_comparison": posthoc.model_dump(mode="json"),
            }
        )
    result: dict[str, Any] = {"command": command, "records": records}
    base = starts.get(("G", "memest")) or starts.get(("G", "vllm"))
    target = starts.get(("G2", "memest")) or starts.get(("G2", "vllm"))
    if base is not None and target is not None:
        report_g = RunReport.model_validate(base["report"])
        report_g2 = RunReport.model_validate(target["report"])
        result["what_if"] = _check_what_if(report_g, report_g2, starts)
        if report_g.breakdown is not None and not report_g.breakdown.retained:
            # The engine keeps exactly one aux output per PIECEWISE size alive; what capture
            # left allocated is therefore the retained aux bytes (measured by the allocator).
            cap = next(p for p in report_g.phases if p.name == "capture")
            live = cap.end.torch_allocated_bytes - cap.start.torch_allocated_bytes
            with_retained = report_g.model_copy(deep=True)
            assert with_retained.breakdown is not None
            with_retained.breakdown.retained = [
                RetainedRow(stage="target.piecewise", owner="aux_hidden_states", bytes=live)
            ]
            result["what_if_with_retained"] = _check_what_if(with_retained, report_g2, starts)
            result["what_if_with_retained"]["retained_g_bytes"] = live
    (dst / "lab-h200.json").write_text(json.dumps(result, indent=1) + "\n")
    (dst / "lab-h200.md").write_text(_markdown(result))
    return result


def _grid_label(grid: dict[str, int]) -> str:
    return (
        f"max_num_seqs {grid['max_num_seqs']}, capture cap {grid['max_cudagraph_capture_size']}, "
        f"mnbt {grid['max_num_batched_tokens']}"
    )


def _markdown(result: dict[str, Any]) -> str:
    out = [
        "# Lab engine on the H200: KV budget by estimator, and the what-if check\n\n",
        f"Command: `{result['command']}`\n\n",
        "Usage minus budget = device memory in use at the end of init (after serving's first "
        "max-size step) minus ceil(0.5 x total). The instance column subtracts what was in use "
        "before the engine started (CUDA context, cuBLAS), the way vLLM's own budget counts.\n\n",
        "| configuration | estimator | KV tokens | KV GiB | usage - budget GiB | "
        "instance usage - budget GiB | vLLM graph estimate GiB | graph pool GiB |\n",
        "|---|---|---|---|---|---|---|---|\n",
    ]
    for r in result["records"]:
        out.append(
            f"| {r['configuration']}: {_grid_label(r['grid'])} | {r['estimator']} | {r['kv_tokens']:,} | "
            f"{_gib(r['kv_cache_bytes'])} | {_gib(r['usage_minus_budget_bytes'])} | "
            f"{_gib(r['usage_minus_budget_instance_bytes'])} | "
            f"{_gib(r['vllm_graph_estimate_bytes'])} | {_gib(r['graph_pool_bytes'])} |\n"
        )
    for key, title in (
        ("what_if", "What-if: predict G2 from the run under G (pool growth per owner), measure G2"),
        (
            "what_if_with_retained",
            "Same, with the retained aux bytes of G as a retained row (scaled from live bytes)",
        ),
    ):
        wi = result.get(key)
        if not wi:
            continue
        out.append(
            f"\n## {title}\n\n"
            "| stage | owner | scales with | G MiB | factor | predicted G2 MiB | measured G2 MiB "
            "| error |\n|---|---|---|---|---|---|---|---|\n"
        )
        for r in wi["rows"]:
            err = "-" if r["error"] is None else f"{100 * r['error']:+.1f} %"
            out.append(
                f"| {r['stage']} | {r['owner']} | {r['law']} | {r['g_bytes'] / MiB:.1f} | "
                f"{r['factor']:.3f} | {r['predicted_g2_bytes'] / MiB:.1f} | "
                f"{r['measured_g2_bytes'] / MiB:.1f} | {err} |\n"
            )
        pool_err = wi["graph_pool_error"]
        out.append(
            f"\nGraph pool: predicted {_gib(wi['graph_pool_predicted_bytes'])} GiB, measured "
            f"{_gib(wi['graph_pool_measured_bytes'])} GiB"
            + (f" ({100 * pool_err:+.1f} %)" if pool_err is not None else "")
            + f". KV budget predicted for G2: {_gib(wi['kv_budget_predicted_bytes'])} GiB"
            + (
                f" (memest measured it at {_gib(wi['kv_budget_memest_g2_bytes'])} GiB in the G2 start)"
                if wi["kv_budget_memest_g2_bytes"] is not None
                else ""
            )
            + f". Dominant change: {wi['dominant_owner']} ({_gib(wi['dominant_change_bytes'])} GiB)."
            "\n"
        )
    return "".join(out)


# ------------------------------------------------------------------------------------------------
# Parent: every grid with each estimator, in its own process
# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--child", nargs=2, metavar=("GRID", "ESTIMATOR"))
    parser.add_argument(
        "--summarize", type=Path, metavar="SRC", help="CPU: write --out from the starts in SRC"
    )
    parser.add_argument("--command", default="", help="the command recorded with --summarize")
    parser.add_argument(
        "--starts",
        default="G:memest,G2:memest,G:vllm,G2:vllm",
        help="GRID:ESTIMATOR pairs, run in this order",
    )
    parser.add_argument("--budget-s", type=float, default=100.0, help="start no run after this")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        summarize(args.summarize, args.out, args.command)
        return 0
    if args.child:
        grid_name, estimator = args.child
        t0 = time.time()
        # As vLLM's freeze_gc_for_cudagraph_capture: each torch.cuda.graph() runs gc.collect().
        gc.freeze()
        result = run_start(grid_name, estimator)
        result["lab"]["seconds"] = round(time.time() - t0, 1)
        (args.out / f"start_{grid_name}_{estimator}.json").write_text(json.dumps(result, indent=1))
        return 0
    failures = 0
    began = time.time()
    for pair in args.starts.split(","):
        grid_name, estimator = pair.split(":")
        if time.time() - began > args.budget_s:
            print(f"start {grid_name} {estimator}: skipped, over --budget-s", flush=True)
            failures += 1
            continue
        cmd = [sys.executable, __file__, "--out", str(args.out), "--child", grid_name, estimator]
        t0 = time.time()
        proc = subprocess.run(cmd, env=os.environ.copy())
        took = time.time() - t0
        print(f"start {grid_name} {estimator}: rc={proc.returncode} in {took:.1f}s", flush=True)
        failures += proc.returncode != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
