"""Per-stream readings from the allocator's segments: ``_compat.stream_usage`` and
``pool_usage`` over segments already read, and vLLM 0.33.0's serving / aux stream handles
(``measure.vllm_streams``, ``measure._stream_figures``), with hand-made segment dicts."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from memest_instrumentation.torch import _compat
from memest_instrumentation.vllm import measure

from memest.schema import MemoryReading

MiB = 1 << 20
SERVING = 111  # stream handles (torch.cuda.Stream.cuda_stream)
AUX = 222


def _seg(stream: int, total: int, allocated: int, pool: Any = None) -> dict[str, Any]:
    seg: dict[str, Any] = {
        "device": 0,
        "stream": stream,
        "total_size": total,
        "allocated_size": allocated,
    }
    if pool is not None:
        seg["segment_pool_id"] = pool
    return seg


SEGMENTS = [
    _seg(SERVING, 20 * MiB, 6 * MiB, (0, 0)),  # free 14 MiB
    _seg(SERVING, 2 * MiB, 0),  # no pool id: the default pool, free 2 MiB
    _seg(SERVING, 8 * MiB, 3 * MiB, (0, 1)),  # a graph pool on the same stream: left out
    _seg(AUX, 64 * MiB, 32 * MiB, (0, 0)),  # free 32 MiB
    _seg(0, 10 * MiB, 10 * MiB, (0, 0)),  # the legacy default stream, full
]


def test_stream_usage_sums_the_default_pool_segments_of_one_stream() -> None:
    assert _compat.stream_usage(SEGMENTS, SERVING) == (16 * MiB, 6 * MiB)
    assert _compat.stream_usage(SEGMENTS, AUX) == (32 * MiB, 32 * MiB)
    assert _compat.stream_usage(SEGMENTS, 0) == (0, 10 * MiB)


def test_stream_usage_excludes_graph_pool_segments_on_the_stream() -> None:
    only_pool = [_seg(SERVING, 8 * MiB, 3 * MiB, (0, 1)), _seg(SERVING, 4 * MiB, 1 * MiB, "0,2")]
    assert _compat.stream_usage(only_pool, SERVING) == (0, 0)


def test_stream_usage_of_a_stream_not_made_yet_is_zero() -> None:
    assert _compat.stream_usage(SEGMENTS, -1) == (0, 0)
    assert _compat.stream_usage(SEGMENTS, 333) == (0, 0)
    assert _compat.stream_usage([], SERVING) == (0, 0)


def test_pool_usage_reads_the_given_segments_per_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    def unread(device: int) -> list[dict[str, Any]]:
        raise AssertionError("segments were given: none to read")

    monkeypatch.setattr(_compat, "segments", unread)
    assert _compat.pool_usage(0, SEGMENTS) == {
        "0,0": (96 * MiB, 48 * MiB),  # 20+2+64+10 reserved, 6+0+32+10 allocated
        "0,1": (8 * MiB, 3 * MiB),
    }
    assert _compat.pool_usage(0, []) == {}


def test_pool_usage_reads_the_segments_when_none_are_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_compat, "segments", lambda device: SEGMENTS[2:4])
    assert _compat.pool_usage(0) == {"0,1": (8 * MiB, 3 * MiB), "0,0": (64 * MiB, 32 * MiB)}


@pytest.fixture
def torch_utils(monkeypatch: pytest.MonkeyPatch) -> Any:
    """vLLM's module with neither stream made (restored after the test)."""
    from vllm.utils import torch_utils

    monkeypatch.setattr(torch_utils, "_aux_stream", None)
    monkeypatch.setattr(torch_utils._current_stream_tls, "value", None, raising=False)
    return torch_utils


@pytest.mark.vllm
def test_vllm_streams_gives_the_handles_of_both_streams(
    monkeypatch: pytest.MonkeyPatch, torch_utils: Any
) -> None:
    monkeypatch.setattr(
        torch_utils._current_stream_tls, "value", SimpleNamespace(cuda_stream=SERVING)
    )
    monkeypatch.setattr(torch_utils, "_aux_stream", SimpleNamespace(cuda_stream=AUX))
    assert measure.vllm_streams() == (SERVING, AUX)


@pytest.mark.vllm
def test_vllm_streams_gives_minus_one_for_streams_not_made_yet(
    monkeypatch: pytest.MonkeyPatch, torch_utils: Any
) -> None:
    assert measure.vllm_streams() == (-1, -1)
    monkeypatch.delattr(torch_utils._current_stream_tls, "value")  # never set on this thread
    monkeypatch.setattr(torch_utils, "_aux_stream", SimpleNamespace(cuda_stream=AUX))
    assert measure.vllm_streams() == (-1, AUX)


@pytest.mark.vllm
def test_vllm_streams_makes_no_stream(torch_utils: Any) -> None:
    measure.vllm_streams()
    assert torch_utils._aux_stream is None
    assert torch_utils._current_stream_tls.value is None


def test_vllm_streams_without_vllm_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm.utils", None)
    assert measure.vllm_streams() == (None, None)


def test_stream_figures_read_serving_free_and_aux_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(measure, "vllm_streams", lambda: (SERVING, AUX))
    figures = measure._stream_figures(SEGMENTS)
    assert figures == {
        "serving_stream_free_bytes": 16 * MiB,
        "aux_stream_allocated_bytes": 32 * MiB,
    }
    reading = MemoryReading(time_ns=0, **figures)
    assert reading.serving_stream_free_bytes == 16 * MiB
    assert reading.aux_stream_allocated_bytes == 32 * MiB


def test_stream_figures_before_the_streams_exist_are_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "vllm_streams", lambda: (-1, -1))
    assert measure._stream_figures(SEGMENTS) == {
        "serving_stream_free_bytes": 0,
        "aux_stream_allocated_bytes": 0,
    }


def test_stream_figures_without_vllm_are_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "vllm_streams", lambda: (None, None))
    assert measure._stream_figures(SEGMENTS) == {}


def test_reading_carries_the_stream_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {"reserved_bytes.all.current": 104 * MiB, "allocated_bytes.all.current": 51 * MiB}
    cuda = SimpleNamespace(
        synchronize=lambda: None,
        mem_get_info=lambda: (900 * MiB, 1000 * MiB),
        memory_stats=lambda: stats,
    )
    monkeypatch.setattr(measure, "cuda_ready", lambda: True)
    monkeypatch.setattr(measure, "_torch", lambda: SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(_compat, "current_device", lambda: 0)
    monkeypatch.setattr(_compat, "segments", lambda device: SEGMENTS)
    monkeypatch.setattr(measure, "vllm_streams", lambda: (SERVING, AUX))
    r = measure.reading()
    assert r.device_used_bytes == 100 * MiB
    assert r.pool_reserved_bytes == {"0,0": 96 * MiB, "0,1": 8 * MiB}
    assert r.serving_stream_free_bytes == 16 * MiB
    assert r.aux_stream_allocated_bytes == 32 * MiB
