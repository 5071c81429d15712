"""vLLM 0.34's growable KV cache is driver memory outside PyTorch's allocator: the terms of a
start whose KV cache was mapped that way are those of the same start with PyTorch's KV cache."""

from __future__ import annotations

from pathlib import Path

from memest.estimate import account
from memest.estimate.phases import measured_kv_bytes
from memest.estimate.terms.catalog import full_init_terms
from memest.schema import ExtensibleKvSizing, MemoryReading, RunReport

ROOT = Path(__file__).resolve().parents[3]
START = ROOT / "tests/data/starts/call11.W1_llama8b_s32_t4096.apply.report.rank0.json"


def _without_kv_in_torch(reading: MemoryReading, kv: int) -> MemoryReading:
    return reading.model_copy(
        update={
            "torch_allocated_bytes": reading.torch_allocated_bytes - kv,
            "torch_reserved_bytes": reading.torch_reserved_bytes - kv,
        }
    )


def _as_growable(report: RunReport) -> RunReport:
    """The same start with its KV cache in driver memory: PyTorch's readings from the KV
    allocation on hold kv bytes less; the device's used memory is unchanged."""
    kv = measured_kv_bytes(report)
    names = [p.name for p in report.phases]
    after = names.index("kv_cache_alloc")
    phases = []
    for i, record in enumerate(report.phases):
        start = _without_kv_in_torch(record.start, kv) if i > after else record.start
        end = _without_kv_in_torch(record.end, kv) if i >= after else record.end
        phases.append(record.model_copy(update={"start": start, "end": end}))
    assert report.vllm is not None
    sizing = ExtensibleKvSizing(
        capacity_blocks=1,
        bytes_per_block=1,
        committed_bytes=kv,
        init_free_bytes=0,
        free_after_warmup_bytes=0,
        committed_at_sizing_bytes=0,
        requested_bytes=0,
        transient_peak_bytes=0,
        torch_reserve_growth_bytes=0,
        margin_bytes=0,
        non_torch_reserve_bytes=0,
        vllm_kv_bytes=kv,
    )
    vllm = report.vllm.model_copy(update={"extensible_kv": sizing})
    return report.model_copy(update={"phases": phases, "vllm": vllm})


def test_a_driver_mapped_kv_cache_is_neither_outside_torch_nor_a_runner_buffer() -> None:
    report = RunReport.model_validate_json(START.read_text())
    growable = _as_growable(report)
    assert full_init_terms(growable).model_dump(exclude={"source"}) == full_init_terms(
        report
    ).model_dump(exclude={"source"})
    assert account(growable).usage_bytes == account(report).usage_bytes
