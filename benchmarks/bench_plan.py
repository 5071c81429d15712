"""Resolve the seed reviewer's 2,880-configuration sweep with both sizings and print the time.

SM100 on/off × max_num_seqs {1, 8, 72, 128, 256, 512} × K {0, 1, 3, 5, 7, 16} × dynamic SD
{none, 3-tier} (3 tiers need K ≥ 3: 10 K/SD pairs) × max_num_batched_tokens {2048, 8192} ×
{default, max 1024, max 8192, power-of-two list} × 3 CUDA-graph modes = 2,880. K > 0 uses
EAGLE3, so every target and drafter runner is resolved. Target: ≤ 1 s on one core.

    python benchmarks/bench_plan.py [--repeat N] [--cold]

--cold clears the memoized pure rules (grids, dynamic-SD runs, vLLM's token list) before every
pass, so each pass computes all of them once; without it later passes reuse them.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections import Counter
from typing import Any

from memest.plan import PlanInput, clear_caches, resolve
from memest.schema.plan import CapturePlan

POW2 = tuple(1 << i for i in range(10))  # 1 … 512
SIZINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "max1024": {"max_cudagraph_capture_size": 1024},
    "max8192": {"max_cudagraph_capture_size": 8192},
    "pow2": {"cudagraph_capture_sizes": POW2},
}
MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE")


def three_tier(k: int) -> tuple[tuple[int, int, int], ...]:
    return ((1, 16, k), (17, 256, max(2, k // 2)), (257, 4096, 1))


def sweep() -> list[PlanInput]:
    k_dyn: list[tuple[int, Any]] = [(0, None), (1, None)]
    k_dyn += [(k, d) for k in (3, 5, 7, 16) for d in (None, three_tier(k))]
    out = []
    for sm100, seqs, (k, dyn), mnbt, sizing, mode in itertools.product(
        (True, False), (1, 8, 72, 128, 256, 512), k_dyn, (2048, 8192), SIZINGS, MODES
    ):
        out.append(
            PlanInput(
                sm100=sm100,
                max_num_seqs=seqs,
                max_num_batched_tokens=mnbt,
                spec_method="eagle3" if k else None,
                num_speculative_tokens=k,
                dynamic_sd=dyn,
                cudagraph_mode=mode,  # type: ignore[arg-type]
                **SIZINGS[sizing],
            )
        )
    return out


def _rows(plan: CapturePlan) -> dict[tuple[str, int, int | None], list[int]]:
    return {(r.runner, r.q, r.tier_k): r.sizes for r in plan.runners}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--cold", action="store_true", help="forget memoized grids and token lists before each pass"
    )
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    inputs = sweep()
    assert len(inputs) == 2880, len(inputs)
    timings: dict[str, list[float]] = {"seed": [], "vllm-0.33.0": []}
    cpu: dict[str, list[float]] = {"seed": [], "vllm-0.33.0": []}
    plans: dict[str, list[CapturePlan]] = {}
    for _ in range(args.repeat):
        for sizing in timings:
            if args.cold:
                clear_caches()
            start, start_cpu = time.perf_counter(), time.process_time()
            plans[sizing] = [resolve(inp, sizing) for inp in inputs]  # type: ignore[arg-type]
            timings[sizing].append(time.perf_counter() - start)
            cpu[sizing].append(time.process_time() - start_cpu)
    best = {s: min(t) for s, t in timings.items()}
    best_cpu = {s: min(t) for s, t in cpu.items()}
    # On a shared machine wall time includes waiting for the core; CPU time does not.
    load = os.getloadavg()[0]
    print(
        f"configurations: {len(inputs)} (one core, best of {args.repeat}"
        f"{', cold caches' if args.cold else ''}; load {load:.1f})"
    )
    for sizing, seconds in best.items():
        print(
            f"  {sizing:<12} wall {seconds * 1000:7.1f} ms  cpu {best_cpu[sizing] * 1000:7.1f} ms"
            f"  ({best_cpu[sizing] / len(inputs) * 1e6:.0f} µs/config)"
        )
    print(
        f"  both         wall {sum(best.values()) * 1000:7.1f} ms  "
        f"cpu {sum(best_cpu.values()) * 1000:7.1f} ms  (target ≤ 1000 ms)"
    )

    same: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for seed, main_ in zip(plans["seed"], plans["vllm-0.33.0"], strict=True):
        a, b = _rows(seed), _rows(main_)
        for runner in {key[0] for key in a} | {key[0] for key in b}:
            seen[runner] += 1
            sa = {k: v for k, v in a.items() if k[0] == runner}
            sb = {k: v for k, v in b.items() if k[0] == runner}
            same[runner] += sa == sb
    print("seed vs vLLM 0.33.0, configurations with identical sizes per runner:")
    for runner in sorted(seen):
        print(f"  {runner:<24} {same[runner]:5d} / {seen[runner]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
