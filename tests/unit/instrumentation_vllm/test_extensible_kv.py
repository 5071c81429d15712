"""vLLM 0.34's growable KV cache: memest's hooks on its real sizing functions (CPU).

``measure_kv_cache_blocks`` reads the GPU, so a stand-in plays it, calling the real
``measure_kv_cache_bytes`` through the module attribute memest patches, as vLLM's does.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import memest_instrumentation.vllm as plugin
import pytest
from conftest import vllm_or_skip
from memest_instrumentation.vllm.hooks import EXTENSIBLE_PATCHES, PATCHES_BY_VERSION
from memest_instrumentation.vllm.state import reset_state, state

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_release("0.34.0")]
GIB = 1 << 30

# Readings of one sizing, in GiB: 130 free at start, 40 free after capture beside 0.5 committed,
# 140 requested (utilization 1.0), a 4 GiB transient peak and 1 GiB of torch reservation growth.
READINGS = {
    "init_free_memory": 130 * GIB,
    "free_memory": 40 * GIB,
    "committed_bytes": GIB // 2,
    "requested_memory": 140 * GIB,
}
TRANSIENT = 4 * GIB
GROWTH = 1 * GIB


@pytest.fixture(autouse=True)
def _vllm034() -> Any:
    vllm_or_skip()
    plugin.uninstrument()
    yield
    plugin.uninstrument()


def _kv_cache() -> SimpleNamespace:
    return SimpleNamespace(
        capacity_blocks=20_000,
        bytes_per_block=2 << 20,
        reserved_headroom_bytes=TRANSIENT,
        torch_reserve_growth_bytes=GROWTH,
        torch_memory_limit=None,
        num_committed_blocks=2,
        physical_bytes=GIB // 2,
    )


def _sizing(memest_headroom: int | None = None) -> int:
    """vLLM's measure_kv_cache_blocks, less the GPU: its measure_kv_cache_bytes call."""
    reset_state()  # the settings of the test's environment
    state().figures.profile_headroom_bytes = memest_headroom
    import vllm.v1.worker.extensible_kv_cache as ext
    import vllm.v1.worker.gpu_worker as gw

    def measure_blocks(kv_cache: Any, vllm_config: Any, device: Any, **kwargs: Any) -> int:
        available = ext.measure_kv_cache_bytes(
            **READINGS,
            transient_peak_bytes=kv_cache.reserved_headroom_bytes,
            torch_reserve_growth_bytes=kv_cache.torch_reserve_growth_bytes,
        )
        return int(available // kv_cache.bytes_per_block)

    patched = next(p for p in EXTENSIBLE_PATCHES if p.attr == "measure_kv_cache_blocks")
    wrapped = patched.make(measure_blocks)
    assert plugin.instrument() == []
    assert hasattr(gw.measure_kv_cache_blocks, "__memest_original__")
    return int(wrapped(_kv_cache(), None, None, init_free_memory=0, requested_memory=0))


def test_the_034_patch_list_goes_in_on_the_real_classes() -> None:
    assert plugin.patches() == PATCHES_BY_VERSION["0.34.0"]
    assert plugin.instrument() == []


def test_vllms_own_sizing_is_recorded_with_its_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    blocks = _sizing()
    sizing = state().vllm.extensible_kv
    assert sizing is not None and sizing.sized_by == "vllm"
    # headroom 40.5 GiB less a margin of max(1, 0.75 x 4) = 3 GiB, less the 4 GiB peak
    assert sizing.margin_bytes == 3 * GIB
    assert sizing.vllm_kv_bytes == int(33.5 * GIB)
    assert blocks == int(33.5 * GIB) // (2 << 20)
    assert sizing.memest_kv_bytes is None
    assert (sizing.transient_peak_bytes, sizing.non_torch_reserve_bytes) == (TRANSIENT, 512 << 20)


def test_apply_passes_memests_transient_and_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_ESTIMATE", "apply")
    monkeypatch.setenv("MEMEST_MARGIN_BYTES", str(GIB // 4))
    blocks = _sizing(memest_headroom=5 * GIB)  # memest's warm pass saw more than vLLM
    sizing = state().vllm.extensible_kv
    assert sizing is not None and sizing.sized_by == "memest"
    # headroom 40.5 GiB less memest's margin (vLLM's 0.5 GiB non-torch reserve + 0.25 GiB),
    # less its 5 GiB transient
    assert sizing.memest_kv_bytes == int(34.75 * GIB)
    assert blocks == int(34.75 * GIB) // (2 << 20)
    assert sizing.vllm_kv_bytes == int(33.5 * GIB)  # what vLLM alone would have committed
    assert (sizing.memest_transient_peak_bytes, sizing.memest_margin_bytes) == (
        5 * GIB,
        3 * GIB // 4,
    )
    assert sizing.memest_measured_transient_bytes == 5 * GIB  # memest's own, above vLLM's 4
    assert state().notes[-1] == (
        "vLLM's growable KV cache: 33.500 GiB by vLLM's sizing, keeping its 4.000 GiB measured "
        "transient peak and a 3.000 GiB margin free; memest's sizing 34.750 GiB (transient "
        "5.000 GiB, margin 0.750 GiB); 17792 blocks on this rank"
    )


def test_vllms_measured_peak_stays_the_floor_of_memests_transient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A warm pass that saw less than vLLM's profiled peak: vLLM's peak is kept free (torch's
    allocator is capped by what the sizing keeps free), and memest's own figure is recorded."""
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_ESTIMATE", "apply")
    _sizing(memest_headroom=GIB)
    sizing = state().vllm.extensible_kv
    assert sizing is not None and sizing.sized_by == "memest"
    assert sizing.memest_transient_peak_bytes == TRANSIENT == 4 * GIB
    assert sizing.memest_measured_transient_bytes == GIB


@pytest.mark.parametrize(("mode", "sized_by"), [("plan", "vllm"), ("apply", "memest")])
def test_the_report_follows_extend_kv_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, sized_by: str
) -> None:
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_ESTIMATE", mode)
    _sizing(memest_headroom=5 * GIB)  # apply sizes with memest's terms beside a measured one
    worker_patches = {p.name: p for p in PATCHES_BY_VERSION["0.34.0"] if p.owner == "Worker"}
    kv_cache = _kv_cache()
    kv_cache.num_committed_blocks, kv_cache.physical_bytes = 16_000, 16_000 * (2 << 20)
    worker = SimpleNamespace(
        cache_config=SimpleNamespace(enable_extensible_kv_cache=True),
        model_runner=SimpleNamespace(extensible_kv_cache=kv_cache),
    )
    warm_up = worker_patches["end_of_init"].make(lambda self: "compile-times")
    assert warm_up(worker) == "compile-times"
    assert not state().finalized  # the committed size is not known yet
    extend = worker_patches["kv_cache_extend"].make(lambda self, num_blocks: None)
    extend(worker, 16_000)
    assert state().finalized
    [path] = (tmp_path / "out").rglob("*.json")
    report = json.loads(path.read_text())
    assert [p["name"] for p in report["phases"]][-2:] == ["kv_cache_extend", "end"]
    sizing = report["vllm"]["extensible_kv"]
    assert (sizing["committed_blocks"], sizing["committed_bytes"]) == (16_000, 16_000 * (2 << 20))
    assert report["vllm"]["num_gpu_blocks"] == 16_000
    assert (sizing["sized_by"], report["kv_sized_by"]) == (sized_by, sized_by)


def test_apply_without_memests_headroom_keeps_vllms_sizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """memest's margin stands only beside its measured transient: with no warm profile pass
    measured, vLLM's own margin and transient size the cache."""
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_ESTIMATE", "apply")
    blocks = _sizing(memest_headroom=None)
    sizing = state().vllm.extensible_kv
    assert sizing is not None and sizing.sized_by == "vllm"
    assert blocks == int(33.5 * GIB) // (2 << 20)  # as vLLM alone, above
    assert any("not measured" in n for n in state().notes)


def test_an_unset_utilization_is_read_as_vllm_resolves_it() -> None:
    """0.34's CacheConfig leaves gpu_memory_utilization None; the report takes the resolved one."""
    from memest_instrumentation.vllm.collect import resolved_utilization
    from vllm.config import CacheConfig

    assert CacheConfig().gpu_memory_utilization is None
    assert resolved_utilization(CacheConfig()) == CacheConfig().resolved_gpu_memory_utilization
    assert resolved_utilization(CacheConfig(gpu_memory_utilization=0.8)) == 0.8
