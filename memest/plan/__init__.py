"""Capture plans: vLLM 0.33.0's own sizing ("main") and the seed's five fields, graphs per runner.

A pipeline, each stage called once and returning a value: flags -> PlanInput (inputs.py,
overlay.py) -> vLLM's sizes (vllm033.vllm_sizes) -> the seed's tiers (seed.resolve_seed) ->
rows (resolve.py). Each sizing hands the rows one RunnerSizes (sizes.py).

Usage::

    from memest.plan import PlanInput, resolve, resolve_both, plan_input_from_compilation_config

    inp = plan_input_from_compilation_config(
        '{"max_prefill_cudagraph_capture_tokens": 8192}',
        sm100=True, max_num_seqs=1024, max_num_batched_tokens=16384,
        spec_method="eagle3", num_speculative_tokens=3,
    )
    seed, main = resolve_both(inp)        # CapturePlan each; .runners is one RunnerRow per runner
"""

from __future__ import annotations

from memest.plan import grids as _grids
from memest.plan import vllm033 as _vllm033
from memest.plan.grids import av_grid, decode_grid, prefill_grid
from memest.plan.inputs import (
    GPU_PRESETS,
    SERVE_DEFAULTS,
    SPEC_METHODS,
    PlanInput,
    gpu_preset,
    plan_input_from_compilation_config,
)
from memest.plan.padding import PaddingCost, expected_padding, uniform_histogram
from memest.plan.resolve import SIZING_LEGEND, SIZING_NAMES, SIZINGS, resolve, resolve_both
from memest.plan.seed import resolve_seed
from memest.plan.sizes import DecodeTier, RunnerSizes
from memest.plan.vllm033 import (
    MainSizes,
    VllmSizes,
    capture_sizes,
    manager_descriptors,
    vllm_sizes,
)


def clear_caches() -> None:
    """Forget memoized grids, dynamic-SD runs and vLLM token lists (for cold-start timing)."""
    for cached in (
        _grids._prefill_grid,
        _grids._decode_grid,
        _grids._av_grid,
        _vllm033.dynamic_sd_segments,
        _vllm033._capture_sizes,
    ):
        cached.cache_clear()


__all__ = [
    "GPU_PRESETS",
    "SERVE_DEFAULTS",
    "SIZINGS",
    "SIZING_LEGEND",
    "SIZING_NAMES",
    "SPEC_METHODS",
    "VllmSizes",
    "DecodeTier",
    "MainSizes",
    "PaddingCost",
    "PlanInput",
    "RunnerSizes",
    "av_grid",
    "capture_sizes",
    "clear_caches",
    "decode_grid",
    "expected_padding",
    "gpu_preset",
    "manager_descriptors",
    "plan_input_from_compilation_config",
    "prefill_grid",
    "resolve",
    "resolve_both",
    "resolve_seed",
    "uniform_histogram",
    "vllm_sizes",
]
