"""The phase model: what a complete initialization retains besides the KV cache.

From the phase readings of one start (weights, profile_run, graph_profiling, kv_cache_alloc,
capture, end) and its stage breakdown, each term of ``FullInitTerms`` is read as follows:

- baseline: allocator reservation before the weights (cuBLAS workspaces from device init);
- weights: allocated bytes added over the ``weights`` phase;
- activation headroom: the reservation a second, warm profile pass adds from an empty cache
  (phase ``profile_run.warm``), else the allocated peak of ``profile_run`` above what it left
  allocated (vLLM's ``transient_peak_headroom``); serving's first max-size step needs it again;
- outside PyTorch: device memory in use minus allocator reservation at the last reading
  (CUDA context, library handles, NCCL, graph objects);
- graph pools: reserved growth per capture stage (breakdown), or private-pool readings;
- runner buffers: allocated bytes added over ``kv_cache_alloc`` minus the KV cache itself, plus
  default-pool allocations made after it (warm-up, graph outputs) and still live at the end;
- profiling residue: the reservation when the KV cache is allocated beyond the baseline and the
  weights (memest.estimate.terms.catalog: the one definition, the plugin's too).

Each term's reader is memest.estimate.terms.catalog's; this module reads the phases they take.
"""

from __future__ import annotations

import math

from memest.errors import InvariantError, ReportFormatError
from memest.estimate.kv import kv_page_bytes
from memest.schema import SCHEMA_VERSION, FullInitTerms, MemoryReading, PhaseRecord, RunReport
from memest.snapshot.tags import DEFAULT_POOL

REQUIRED_PHASES = ("weights", "profile_run", "kv_cache_alloc")


def check_report(report: RunReport) -> None:
    """Refuse a report of another schema version or without the phases the estimator reads.

    Raises:
        ReportFormatError: naming the schema version or the missing phase.
    """
    if report.schema_version != SCHEMA_VERSION:
        raise ReportFormatError(
            f"report {report.report_id}: schema_version {report.schema_version!r}, "
            f"memest reads {SCHEMA_VERSION!r}"
        )
    names = {p.name for p in report.phases}
    for name in REQUIRED_PHASES:
        if name not in names:
            raise ReportFormatError(
                f"report {report.report_id}: phase {name!r} is missing "
                f"(phases present: {sorted(names) or 'none'})"
            )
    if "capture" not in names and "end" not in names:
        raise ReportFormatError(
            f"report {report.report_id}: neither phase 'capture' nor 'end' is present, "
            "so the end state of initialization is unknown"
        )
    if report.config.mla_warm_pass_without_standin and "profile_run.warm" not in names:
        raise ReportFormatError(
            f"report {report.report_id}: config.mla_warm_pass_without_standin is true but "
            "phase 'profile_run.warm' is missing, so the activation headroom is unknown"
        )


def phase(report: RunReport, name: str) -> PhaseRecord | None:
    """The last phase record called ``name``, or None."""
    found = [p for p in report.phases if p.name == name]
    return found[-1] if found else None


def require_phase(report: RunReport, name: str) -> PhaseRecord:
    record = phase(report, name)
    if record is None:
        raise ReportFormatError(f"report {report.report_id}: phase {name!r} is missing")
    return record


def final_reading(report: RunReport) -> MemoryReading:
    """The reading that closes initialization: end of ``end``, else end of ``capture``."""
    record = phase(report, "end") or phase(report, "capture")
    if record is None:
        raise ReportFormatError(f"report {report.report_id}: phase 'end' (or 'capture') is missing")
    return record.end


def device_used(reading: MemoryReading, report: RunReport, where: str) -> int:
    if reading.device_used_bytes is None:
        raise ReportFormatError(
            f"report {report.report_id}: {where} has no device_used_bytes reading"
        )
    return reading.device_used_bytes


def total_bytes(report: RunReport) -> int:
    if report.gpu is not None and report.gpu.total_bytes:
        return report.gpu.total_bytes
    for p in report.phases:
        for reading in (p.start, p.end):
            if reading.device_total_bytes:
                return reading.device_total_bytes
    raise ReportFormatError(f"report {report.report_id}: device total memory is unknown")


def requested_bytes(report: RunReport) -> int:
    """The budget: vLLM's ``requested_memory`` if read, else ceil(utilization x total)."""
    if report.vllm is not None and report.vllm.requested_memory_bytes is not None:
        return report.vllm.requested_memory_bytes
    util = report.config.gpu_memory_utilization
    if util is None:
        raise ReportFormatError(
            f"report {report.report_id}: config.gpu_memory_utilization is missing, "
            "so the budget is unknown"
        )
    return budget_bytes(total_bytes(report), util)


def budget_bytes(total: int, gpu_memory_utilization: float) -> int:
    """vLLM's requested memory: ceil(gpu_memory_utilization x total)."""
    return math.ceil(total * gpu_memory_utilization)


def measured_kv_bytes(report: RunReport) -> int:
    """Bytes of the KV cache this start allocated (whole blocks, all layers)."""
    spec = report.kv_cache
    num_blocks = spec.num_blocks if spec is not None else None
    if num_blocks is None and report.vllm is not None:
        num_blocks = report.vllm.num_gpu_blocks
    if spec is None or num_blocks is None:
        raise ReportFormatError(
            f"report {report.report_id}: kv_cache spec with num_blocks is missing, "
            "so the KV-cache size is unknown"
        )
    return num_blocks * kv_page_bytes(spec)


def _private_pool_bytes(reading: MemoryReading) -> int:
    return sum(v for k, v in reading.pool_reserved_bytes.items() if k != DEFAULT_POOL)


def graph_pool_by_stage(report: RunReport) -> dict[str, int]:
    """Reserved pool growth per stage of the real capture.

    Taken from the breakdown's stage rows; without them, from private-pool readings of the
    ``capture`` phase as one stage called ``capture``.
    """
    by_stage: dict[str, int] = {}
    if report.breakdown is not None:
        for row in report.breakdown.stages:
            if row.phase == "capture":
                by_stage[row.stage] = by_stage.get(row.stage, 0) + row.pool_growth_bytes
    if by_stage:
        return by_stage
    capture = phase(report, "capture")
    if capture is not None and capture.end.pool_reserved_bytes:
        growth = _private_pool_bytes(capture.end) - _private_pool_bytes(capture.start)
        return {"capture": max(growth, 0)}
    if report.breakdown is not None and report.breakdown.graph_pool_growth_bytes:
        return {"capture": report.breakdown.graph_pool_growth_bytes}
    return {}


def warm_pass_headroom(start: MemoryReading, end: MemoryReading) -> int:
    """Reservation a profile pass adds from an empty cache (at least its allocated transient)."""
    reserved = end.torch_reserved_peak_bytes - start.torch_reserved_bytes
    allocated = end.torch_allocated_peak_bytes - end.torch_allocated_bytes
    return max(reserved, allocated, 0)


def activation_headroom(report: RunReport, profile: PhaseRecord) -> int:
    """What serving's first full-size step needs beyond the memory in use at the end of init.

    The vLLM plugin runs a second, warm profile pass (phase ``profile_run.warm``) from an empty
    allocator cache and reads the reservation it adds: no torch.compile transients, and block
    rounding and segment sizes included. Without it, vLLM's own quantity: the allocated peak of
    the profile run above what it left allocated.
    """
    warm = phase(report, "profile_run.warm")
    if warm is not None:
        return warm_pass_headroom(warm.start, warm.end)
    return max(profile.end.torch_allocated_peak_bytes - profile.end.torch_allocated_bytes, 0)


def kept_after_kv(report: RunReport, kv_alloc: PhaseRecord, final: MemoryReading) -> int:
    """Default-pool bytes allocated after the KV cache (warm-up, capture) and live at the end.

    Graph output buffers and workspaces the captured graphs point at; graph-pool blocks are
    counted by reservation already, so their live bytes are taken out.
    """
    rows = [] if report.breakdown is None else report.breakdown.retained
    pool_rows = [r for r in rows if r.owner == "graph_pool_live_blocks"]
    if not pool_rows:
        # Without the plugin's reading of the pools' live blocks the growth cannot be split
        # from graph-pool memory already counted by reservation: counted there alone.
        return 0
    live_in_pools = sum(r.bytes for r in pool_rows)
    grown = final.torch_allocated_bytes - kv_alloc.end.torch_allocated_bytes
    return max(grown - live_in_pools, 0)


def growable_kv_bytes(report: RunReport) -> int:
    """Committed bytes of vLLM 0.34's growable KV cache (driver-mapped, outside PyTorch's
    allocator; ``report.vllm.extensible_kv``), 0 for a KV cache PyTorch allocated."""
    sizing = report.vllm.extensible_kv if report.vllm is not None else None
    if sizing is None or sizing.committed_bytes is None:
        return 0
    return sizing.committed_bytes


def kv_phase_extra_bytes(report: RunReport, kv_alloc: PhaseRecord) -> int:
    """Bytes the kv_cache_alloc phase allocated beyond the KV cache itself. vLLM 0.34's growable
    KV cache maps driver memory outside PyTorch's allocator, so none of it is in that phase."""
    added = kv_alloc.end.torch_allocated_bytes - kv_alloc.start.torch_allocated_bytes
    in_torch = 0 if growable_kv_bytes(report) else measured_kv_bytes(report)
    return max(added - in_torch, 0)


def non_kv_bytes(terms: FullInitTerms) -> int:
    """Every term the budget must hold besides the KV cache.

    Raises:
        InvariantError: the per-stage graph-pool split does not sum to ``graph_pool_bytes``.
    """
    if terms.graph_pool_by_stage_bytes:
        split = sum(terms.graph_pool_by_stage_bytes.values())
        if split != terms.graph_pool_bytes:
            raise InvariantError(
                f"graph_pool_by_stage_bytes sums to {split}, graph_pool_bytes is "
                f"{terms.graph_pool_bytes}"
            )
    return sum(terms_components(terms).values())


def full_init_kv_budget(terms: FullInitTerms) -> int:
    """KV-cache bytes that fit the budget after every full-initialization term (never negative).

    Raises:
        InvariantError: the per-stage graph-pool split does not sum to ``graph_pool_bytes``.
    """
    return max(terms.requested_bytes - non_kv_bytes(terms), 0)


#: The terms that sum to non-KV memory, in the order tables show them.
TERM_FIELDS = (
    "baseline_torch_bytes",
    "weights_bytes",
    "profile_peak_activation_bytes",
    "mla_context_bytes",
    "outside_torch_bytes",
    "graph_pool_bytes",
    "runner_buffer_bytes",
    "profiling_residue_bytes",
    "margin_bytes",
)


#: What each term is, for an operator (every surface labels terms from here).
TERM_LABELS = {
    "requested_bytes": "budget (gpu_memory_utilization x GPU total)",
    "baseline_torch_bytes": "CUDA libraries before the weights",
    "weights_bytes": "weights",
    "profile_peak_activation_bytes": "activation headroom",
    "mla_context_bytes": "MLA prefill up-projection",
    "outside_torch_bytes": "outside PyTorch (context, NCCL, graphs)",
    "graph_pool_bytes": "graph pools",
    "runner_buffer_bytes": "runner buffers",
    "profiling_residue_bytes": "profiling residue",
    "margin_bytes": "margin",
}


def terms_components(terms: FullInitTerms) -> dict[str, int]:
    """The terms as the ``components`` mapping of an EstimateComparison (they sum to non-KV)."""
    values = terms.model_dump(include=set(TERM_FIELDS))
    return {name: int(values[name]) for name in TERM_FIELDS}
