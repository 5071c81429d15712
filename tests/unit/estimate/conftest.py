"""A hand-built RunReport whose every figure is chosen, so expected results are worked by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from memest.units import GiB, MiB

PAGE = 2 * MiB  # 32 layers x 2 x 8 heads x 128 x 2 B x 16 tokens
KV_BLOCKS = 30_000  # 58.59375 GiB


def _reading(
    used: float,
    reserved: float,
    allocated: float,
    peak: float | None = None,
    pools: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "time_ns": 0,
        "device_used_bytes": int(used * GiB),
        "device_total_bytes": 100 * GiB,
        "device_source": "cudaMemGetInfo",
        "torch_reserved_bytes": int(reserved * GiB),
        "torch_allocated_bytes": int(allocated * GiB),
        "torch_allocated_peak_bytes": int((peak if peak is not None else allocated) * GiB),
        "pool_reserved_bytes": pools or {},
    }


def plan(sizing: str, rows: list[tuple[str, str, int, list[int], str]]) -> dict[str, Any]:
    runners = []
    for runner, mode, q, sizes, unit in rows:
        mult = q if unit == "requests" else 1
        runners.append(
            {
                "runner": runner,
                "label": runner,
                "graph_mode": mode,
                "q": q,
                "graph_count": len(sizes),
                "sizes": sizes,
                "unit": unit,
                "widest_tokens": max(sizes) * mult,
                "sum_tokens": sum(sizes) * mult,
            }
        )
    return {
        "sizing": sizing,
        "gpu": "h200",
        "sm100": False,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "runners": runners,
        "total_graphs": sum(len(r[3]) for r in rows),
    }


PLAN_G = plan(
    "vllm-0.33.0",
    [
        ("target.piecewise", "PIECEWISE", 1, [1, 2, 4, 8], "tokens"),  # widest 8, sum 15
        ("target.full", "FULL", 4, [1, 2], "requests"),  # widest 8, sum 12
        ("draft.block.full", "FULL", 3, [1, 2], "requests"),  # widest 6, sum 9
    ],
)
PLAN_G2 = plan(
    "vllm-0.33.0",
    [
        ("target.piecewise", "PIECEWISE", 1, [1, 2, 4, 8, 16], "tokens"),  # widest 16, sum 31
        ("target.full", "FULL", 4, [1, 2, 4], "requests"),  # widest 16, sum 28
    ],
)


def report_dict() -> dict[str, Any]:
    kv = KV_BLOCKS * PAGE / GiB  # 58.59375
    kv_start_alloc = 16 + 1 / 16  # weights + 64 MiB left by profiling
    reserved_end = 16 + 1 / 16 + kv + 0.5 + 2 + 3  # ... runner 0.5, pools 2, idle cache 3
    return {
        "schema_version": "1",
        "run_id": "hand",
        "model": "hand-built",
        "gpu": {"name": "H200", "total_bytes": 100 * GiB},
        "config": {"model": "hand-built", "gpu_memory_utilization": 0.9},
        "capture_plans": [PLAN_G],
        "kv_cache": {
            "num_layers": 32,
            "num_kv_heads": 8,
            "head_size": 128,
            "dtype_bytes": 2,
            "block_size": 16,
            "num_blocks": KV_BLOCKS,
        },
        "phases": [
            {"name": "weights", "start": _reading(1, 0, 0), "end": _reading(17, 16, 16)},
            {"name": "profile_run", "start": _reading(17, 16, 16), "end": _reading(17, 16, 16, 19)},
            {"name": "graph_profiling", "start": _reading(17, 16, 16), "end": _reading(17, 16, 16)},
            {
                "name": "kv_cache_alloc",
                "start": _reading(17.0625, 16.0625, kv_start_alloc),
                "end": _reading(17.0625 + kv + 0.5, 16.0625 + kv + 0.5, kv_start_alloc + kv + 0.5),
            },
            {
                "name": "capture",
                "start": _reading(
                    17.0625 + kv + 0.5, 16.0625 + kv + 0.5, kv_start_alloc + kv + 0.5
                ),
                "end": _reading(reserved_end - 3 + 1.25, reserved_end - 3, kv_start_alloc + kv + 1),
            },
            {
                "name": "end",
                "start": _reading(
                    reserved_end - 3 + 1.25, reserved_end - 3, kv_start_alloc + kv + 1
                ),
                "end": _reading(reserved_end + 1.25, reserved_end, kv_start_alloc + kv + 1),
            },
        ],
        "breakdown": {
            "phases": [
                {
                    "phase": "capture",
                    "total_added_bytes": 2 * GiB + 64 * MiB,
                    "graph_pool_bytes": 2 * GiB,
                    "other_torch_bytes": 0,
                    "outside_torch_bytes": 64 * MiB,
                }
            ],
            "stages": [
                {"stage": "target.piecewise", "pool_growth_bytes": 240 * MiB},
                {"stage": "target.full", "pool_growth_bytes": 610 * MiB},
                {"stage": "draft.block.full", "pool_growth_bytes": 1198 * MiB},
                # Growth of the throwaway profiling pool: not retained, must be ignored.
                {"stage": "target.full", "phase": "graph_profiling", "pool_growth_bytes": 5 * GiB},
            ],
            "triggers": [
                {"stage": "target.piecewise", "owner": "aux_hidden_states", "bytes": 150 * MiB},
                {"stage": "target.piecewise", "owner": "gemm_workspace", "bytes": 80 * MiB},
                {"stage": "target.full", "owner": "indexer_logits_fp32", "bytes": 400 * MiB},
                {"stage": "target.full", "owner": "indexer_logits_bf16", "bytes": 200 * MiB},
                {"stage": "target.full", "owner": "attn_output", "bytes": 10 * MiB},
                {"stage": "draft.block.full", "owner": "draft_logits", "bytes": 1198 * MiB},
                {
                    "stage": "target.full",
                    "owner": "indexer_logits_fp32",
                    "bytes": 4 * GiB,
                    "phase": "graph_profiling",
                },
            ],
        },
        "estimate": {
            "vllm_graph_profile": {
                "measured_bytes": 3 * GiB,
                "full_samples_bytes": [GiB, MiB // 4],
                "full_graph_count": 51,
            },
            "startup_plan": {
                "fingerprint": "0123456789abcdef",
                "free_memory_baseline_bytes": 99 * GiB,
            },
        },
        "vllm": {"requested_memory_bytes": 90 * GiB, "non_kv_cache_memory_bytes": 19 * GiB},
    }


@pytest.fixture
def make_report() -> Callable[[], dict[str, Any]]:
    return report_dict
