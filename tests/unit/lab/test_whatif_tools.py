"""lab/whatif_tools.py: a start's grid as --grid changes, and whole event lists replayed through
the caching-allocator model; every expectation is worked from the rules.

Rules (c10/cuda/CUDACachingAllocator.cpp): 512 B rounding; <= 1 MiB small pool in 2 MiB
segments; 1-10 MiB requests get 20 MiB segments, >= 10 MiB the request rounded to 2 MiB; best fit
by (stream, size, address); small blocks split when >= 512 B remain, large when > 1 MiB remains;
freed blocks merge with free neighbours.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from memest.schema import RunReport
from memest.units import MiB

ROOT = Path(__file__).resolve().parents[3]
KiB = 1024


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("whatif_tools", ROOT / "lab" / "whatif_tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


tools = _module()
simulate = tools.simulate


def alloc(handle: int, size: int, stream: int = 0) -> Any:
    return tools.SimEvent("alloc", handle, size, stream, index=handle)


def free(handle: int) -> Any:
    return tools.SimEvent("free", handle)


def test_small_requests_pack_four_to_a_segment() -> None:
    # 512 KiB each: a 2 MiB small segment holds 4; the 5th live request needs another one.
    result = simulate([alloc(i, 512 * KiB) for i in range(5)])
    assert result.segments == [2 * MiB, 2 * MiB]
    assert [(t.request_bytes, t.event_index) for t in result.triggers] == [
        (512 * KiB, 0),
        (512 * KiB, 4),
    ]


def test_small_and_large_pools_do_not_share_blocks() -> None:
    # A free 2 MiB small block does not serve a 1.5 MiB (large) request ...
    assert simulate([alloc(1, 512), free(1), alloc(2, 1536 * KiB)]).segments == [2 * MiB, 20 * MiB]
    # ... nor a free 20 MiB large block 512 KiB (small) requests.
    seq = [alloc(1, 1536 * KiB), free(1), *(alloc(h, 512 * KiB) for h in range(2, 6))]
    assert simulate(seq).segments == [20 * MiB, 2 * MiB]


def test_large_block_splits_only_when_more_than_1_mib_remains() -> None:
    # 19 MiB -> 20 MiB segment, 1 MiB left: not > 1 MiB, so not split; 1.5 MiB needs a segment.
    unsplit = simulate([alloc(1, 19 * MiB), alloc(2, 1536 * KiB)])
    assert unsplit.segments == [20 * MiB, 20 * MiB]
    # 18.5 MiB -> 20 MiB segment, 1.5 MiB left: split, and the 1.5 MiB request fits there.
    split = simulate([alloc(1, 18 * MiB + 512 * KiB), alloc(2, 1536 * KiB)])
    assert split.segments == [20 * MiB]


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    # One 20 MiB segment cut into C 8 | B 2 | A 4 | D 2 | E 4 MiB (E takes the last 4 MiB whole);
    # C and A are freed and do not touch. A 4 MiB request must take A (exact fit), not C (first
    # by address), else the 8 MiB request that follows finds no block.
    c, b, a, d, e = range(5)
    seq = [alloc(h, n * MiB) for h, n in ((c, 8), (b, 2), (a, 4), (d, 2), (e, 4))]
    result = simulate([*seq, free(c), free(a), alloc(10, 4 * MiB), alloc(11, 8 * MiB)])
    assert result.segments == [20 * MiB]


def test_freed_neighbours_merge() -> None:
    # X 6 | Y 6 | Z 8 MiB fill one 20 MiB segment. Freed X and Y merge into 12 MiB, which serves
    # a 10 MiB request; unmerged they could not, and 10 MiB would get a segment of its own.
    x, y, z, w = range(4)
    seq = [alloc(x, 6 * MiB), alloc(y, 6 * MiB), alloc(z, 8 * MiB)]
    merged = simulate([*seq, free(y), free(x), alloc(w, 10 * MiB)])
    assert merged.segments == [20 * MiB]
    apart = simulate([*seq, free(x), alloc(w, 10 * MiB)])
    assert apart.segments == [20 * MiB, 10 * MiB]


def test_blocks_are_reused_on_their_own_stream_only() -> None:
    seq = [alloc(1, 4 * MiB, stream=1), free(1), alloc(2, 4 * MiB, stream=2)]
    assert simulate(seq).segments == [20 * MiB, 20 * MiB]


def test_scale_applies_to_scaling_requests_only() -> None:
    # 3 MiB x 4 = 12 MiB: a 12 MiB segment; the non-scaling 512 B request keeps its 2 MiB.
    seq = [alloc(1, 3 * MiB), tools.SimEvent("alloc", 2, 512, scales=False)]
    assert simulate(seq, scale=4).segments == [12 * MiB, 2 * MiB]
    # 3 MiB / 4 = 768 KiB is a small request: it and the 512 B share one 2 MiB segment.
    assert simulate(seq, scale=0.25).segments == [2 * MiB]


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in (ROOT / "tests" / "data" / "reports").glob("*.json")),
)
def test_a_starts_own_grid_overlaid_on_it_changes_nothing(name: str) -> None:
    from memest.plan import resolve
    from memest.plan.overlay import overlay_config, plan_input

    path = ROOT / "tests" / "data" / "reports" / name
    config = RunReport.model_validate_json(path.read_text()).config
    again = overlay_config(config, tools.grid_changes(config, capture_sizes=True))
    fields = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization")
    fields += ("speculative_method", "num_speculative_tokens")
    assert [getattr(again, f) for f in fields] == [getattr(config, f) for f in fields]
    # the capture sizes travel as vLLM's flag: the same graphs are planned
    before = resolve(plan_input(config, sm100=False), "vllm-0.33.0")
    after = resolve(plan_input(again, sm100=False), "vllm-0.33.0")
    assert [r.sizes for r in after.runners] == [r.sizes for r in before.runners]


def test_another_starts_grid_overlaid_asks_for_that_start() -> None:
    from memest.plan.overlay import overlay_config

    data = ROOT / "tests" / "data" / "reports"
    b = RunReport.model_validate_json(
        (data / "call6.B_llama8b_s32_t2048.apply.report.rank0.json").read_text()
    ).config
    e = RunReport.model_validate_json(
        (data / "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json").read_text()
    ).config
    to = overlay_config(b, tools.grid_changes(e))
    assert (to.max_num_seqs, to.max_num_batched_tokens, to.gpu_memory_utilization) == (
        96,
        4096,
        0.88,
    )
    assert (to.speculative_method, to.num_speculative_tokens) == ("eagle3", 5)
