"""vLLM 0.33.0's own capture sizing ("main"), in pure Python.

``capture_sizes`` mirrors ``VllmConfig._set_cudagraph_sizes`` (vllm/config/vllm.py) and
``manager_descriptors`` mirrors ``CudaGraphManager._init_candidates``
(vllm/v1/worker/gpu/cudagraph_utils.py) for one rank without LoRA or micro-batching.
tests/integration/test_vllm_oracle.py compares both with vLLM's own code. ``vllm_sizes`` is the
plan pipeline's stage: a PlanInput's capture sizes and every runner's graphs, in one pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from memest.errors import ConfigError
from memest.plan.sizes import DecodeTier, RunnerSizes

if TYPE_CHECKING:  # inputs.py imports this module's rules to validate a PlanInput
    from memest.plan.inputs import PlanInput

CudaGraphMode = Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
PerformanceMode = Literal["balanced", "interactivity", "throughput"]
DynamicSDSchedule = tuple[tuple[int, int, int], ...]

CUDAGRAPH_MODES: tuple[CudaGraphMode, ...] = (
    "NONE",
    "PIECEWISE",
    "FULL",
    "FULL_DECODE_ONLY",
    "FULL_AND_PIECEWISE",
)
#: (decode_mode, mixed_mode) per mode, as CUDAGraphMode.decode_mode() / mixed_mode().
MODE_HALVES: dict[CudaGraphMode, tuple[str, str]] = {
    "NONE": ("NONE", "NONE"),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE"),
    "FULL": ("FULL", "FULL"),
    "FULL_DECODE_ONLY": ("FULL", "NONE"),
    "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE"),
}


def default_ceiling_tokens(sm100: bool) -> int:
    """The platform's default capture ceiling: 1024 on compute-capability family 100, else 512."""
    return 1024 if sm100 else 512


def _parse_schedule(schedule: DynamicSDSchedule) -> list[tuple[int, int, int]]:
    field = "num_speculative_tokens_per_batch_size"
    if not schedule:
        raise ConfigError(field, list(schedule), "must not be empty")
    parsed: list[tuple[int, int, int]] = []
    for entry in schedule:
        if len(entry) != 3:
            raise ConfigError(field, list(schedule), f"entry {entry!r} is not (start, end, K)")
        start, end, k = (int(x) for x in entry)
        if start <= 0 or end <= 0:
            raise ConfigError(field, list(schedule), f"range ({start}, {end}) must be positive")
        if start > end:
            raise ConfigError(field, list(schedule), f"range start {start} > end {end}")
        if k < 0:
            raise ConfigError(field, list(schedule), f"K={k} must be >= 0")
        parsed.append((start, end, k))
    parsed.sort(key=lambda e: e[0])
    previous_end = 0
    for start, end, _ in parsed:
        if start <= previous_end:
            raise ConfigError(field, list(schedule), "ranges must not overlap")
        previous_end = end
    if parsed[0][0] != 1:
        raise ConfigError(field, list(schedule), "the first range must start at 1")
    return parsed


@lru_cache(maxsize=1024)
def dynamic_sd_segments(
    schedule: DynamicSDSchedule, max_batch_size: int, num_speculative_tokens: int
) -> tuple[tuple[int, int, int], ...]:
    """The dense batch size → K table of ``build_dynamic_sd_schedule_lookup`` as runs.

    Returns (first batch size, last batch size, K) runs covering 1 … max_batch_size. Gaps and
    the tail carry the previous K forward; every K is clamped to ``num_speculative_tokens``.
    Memoized: ``schedule`` must be a tuple of tuples.

    Raises:
        ConfigError: the schedule is empty, overlapping, not starting at 1, or has bad values.
    """
    if max_batch_size <= 0:
        raise ConfigError("max_num_seqs", max_batch_size, "must be > 0")
    if num_speculative_tokens <= 0:
        raise ConfigError(
            "num_speculative_tokens", num_speculative_tokens, "dynamic SD needs K > 0"
        )
    runs: list[tuple[int, int, int]] = []
    next_bs = 1
    last_k: int | None = None
    for start, end, k in _parse_schedule(schedule):
        if start > next_bs and last_k is not None:
            hi = min(start, max_batch_size + 1) - 1
            if hi >= next_bs:
                runs.append((next_bs, hi, min(num_speculative_tokens, last_k)))
        lo, hi = max(start, next_bs), min(end, max_batch_size)
        if hi >= lo:
            runs.append((lo, hi, min(num_speculative_tokens, k)))
        next_bs = max(next_bs, end + 1)
        last_k = k
        if next_bs > max_batch_size:
            break
    if last_k is not None and next_bs <= max_batch_size:
        runs.append((next_bs, max_batch_size, min(num_speculative_tokens, last_k)))
    return tuple(runs)


def dynamic_sd_lookup(
    schedule: DynamicSDSchedule, max_batch_size: int, num_speculative_tokens: int
) -> list[int]:
    """Dense batch size → K table, as ``build_dynamic_sd_schedule_lookup`` builds it.

    Index 0 is unused (0). See ``dynamic_sd_segments`` for the rules and errors.
    """
    dense = [0] * (max_batch_size + 1)
    for lo, hi, k in dynamic_sd_segments(schedule, max_batch_size, num_speculative_tokens):
        dense[lo : hi + 1] = [k] * (hi - lo + 1)
    return dense


def dynamic_sd_ks(
    schedule: DynamicSDSchedule, max_batch_size: int, num_speculative_tokens: int
) -> set[int]:
    """The K values the dense table holds for batch sizes 1 … max_batch_size."""
    return {k for _, _, k in dynamic_sd_segments(schedule, max_batch_size, num_speculative_tokens)}


def dynamic_sd_tiers(
    schedule: DynamicSDSchedule, max_num_seqs: int, num_speculative_tokens: int
) -> list[tuple[int, int]]:
    """(query length, widest batch running at it) per tier, in order of first appearance."""
    widest: dict[int, int] = {}
    for _, hi, k in dynamic_sd_segments(schedule, max_num_seqs, num_speculative_tokens):
        widest[k + 1] = hi
    return list(widest.items())


def _request_counts(max_reqs: int, ceiling: int) -> list[int]:
    max_reqs = min(max_reqs, ceiling)
    counts = [n for n in (1, 2, 4) if n <= max_reqs]
    counts += list(range(8, min(max_reqs + 1, 256), 8))
    counts += list(range(256, max_reqs + 1, 16))
    return sorted(set(counts + [max_reqs]))


@dataclass(frozen=True)
class MainSizes:
    """Resolved ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size`` and warnings."""

    sizes: tuple[int, ...]
    max_size: int
    warnings: tuple[str, ...]


def capture_sizes(
    *,
    sm100: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int = 0,
    dynamic_sd: DynamicSDSchedule | None = None,
    cudagraph_capture_sizes: Sequence[int] | None = None,
    max_cudagraph_capture_size: int | None = None,
    performance_mode: PerformanceMode = "balanced",
    cudagraph_mode: CudaGraphMode = "FULL_AND_PIECEWISE",
) -> MainSizes:
    """vLLM 0.33.0's ``VllmConfig._set_cudagraph_sizes`` for a CUDA platform (memoized).

    Raises:
        ConfigError: where vLLM raises or asserts (empty explicit list, a maximum inconsistent
            with an explicit list, a capture maximum below 1).
    """
    return _capture_sizes(
        sm100,
        max_num_seqs,
        max_num_batched_tokens,
        num_speculative_tokens,
        None if dynamic_sd is None else tuple(tuple(r) for r in dynamic_sd),
        None if cudagraph_capture_sizes is None else tuple(cudagraph_capture_sizes),
        max_cudagraph_capture_size,
        performance_mode,
        "NONE" if cudagraph_mode == "NONE" else "FULL_AND_PIECEWISE",
    )


@lru_cache(maxsize=4096)
def _capture_sizes(
    sm100: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int,
    dynamic_sd: DynamicSDSchedule | None,
    cudagraph_capture_sizes: tuple[int, ...] | None,
    max_cudagraph_capture_size: int | None,
    performance_mode: PerformanceMode,
    cudagraph_mode: CudaGraphMode,
) -> MainSizes:
    """``capture_sizes`` on hashable arguments; only mode NONE changes the result.

    Raises:
        ConfigError: where vLLM raises or asserts (empty explicit list, a maximum inconsistent
            with an explicit list, a capture maximum below 1).
    """
    warnings: list[str] = []
    if cudagraph_mode == "NONE":
        return MainSizes((), 0, tuple(warnings))
    max_size = max_cudagraph_capture_size
    uniform_decode_sizes: list[int] = []
    if max_size is None:
        max_size, uniform_decode_sizes = _default_maximum(
            sm100, max_num_seqs, num_speculative_tokens, dynamic_sd
        )
    max_num_tokens = max_num_batched_tokens
    max_size = min(max_num_tokens, max_size)
    if max_size < 1:
        raise ConfigError(
            "max_cudagraph_capture_size", max_size, "must be >= 1 when CUDA graphs are on"
        )

    if cudagraph_capture_sizes is not None:
        if len(cudagraph_capture_sizes) == 0:
            raise ConfigError(
                "cudagraph_capture_sizes", [], "must contain at least one size with CUDA graphs on"
            )
        sizes = sorted(i for i in set(cudagraph_capture_sizes) if i <= max_num_tokens)
    else:
        sizes = _default_sizes(max_size, max_num_tokens, performance_mode, uniform_decode_sizes)

    valid_max = sizes[-1] if sizes else 0
    if max_cudagraph_capture_size is not None and max_cudagraph_capture_size != valid_max:
        if cudagraph_capture_sizes is not None:
            raise ConfigError(
                "max_cudagraph_capture_size",
                max_cudagraph_capture_size,
                f"must equal the largest cudagraph_capture_sizes entry ({valid_max})",
            )
        warnings.append(f"max_cudagraph_capture_size truncated to {valid_max}")
    if cudagraph_capture_sizes is not None and len(sizes) < len(cudagraph_capture_sizes):
        dropped = sorted(set(cudagraph_capture_sizes) - set(sizes))
        warnings.append(
            f"cudagraph_capture_sizes entries above max_num_batched_tokens dropped: {dropped}"
        )
    return MainSizes(tuple(sizes), valid_max, tuple(warnings))


def _default_maximum(
    sm100: bool,
    max_num_seqs: int,
    num_speculative_tokens: int,
    dynamic_sd: DynamicSDSchedule | None,
) -> tuple[int, list[int]]:
    """vLLM's capture maximum when none is given, and the uniform-decode token sizes it adds
    under that maximum (each dynamic-SD tier's request counts times its query length)."""
    ceiling = default_ceiling_tokens(sm100)
    q = 1 + num_speculative_tokens
    max_size = min(max_num_seqs * q * 2, ceiling)
    if q == 1:
        return max_size, [max_num_seqs] if max_num_seqs <= max_size else []
    tiers = [(q, max_num_seqs)]
    if dynamic_sd is not None:
        try:
            tiers = dynamic_sd_tiers(dynamic_sd, max_num_seqs, num_speculative_tokens)
        except ConfigError:
            pass  # vLLM keeps the single-tier default for an invalid schedule
    decode = {
        n * tq
        for tq, tier_max in tiers
        for n in _request_counts(tier_max, ceiling)
        if n * tq <= max_size
    }
    return max_size, sorted(decode)


def _default_sizes(
    max_size: int,
    max_num_tokens: int,
    performance_mode: PerformanceMode,
    uniform_decode_sizes: list[int],
) -> list[int]:
    """vLLM's capture-size list when none is given: 1, 2, 4 (every size to 32 for
    interactivity), steps of 8 to 256, of 16 beyond, the batch maximum and the decode sizes."""
    if performance_mode == "interactivity":
        sizes = list(range(1, min(max_size, 32) + 1))
    else:
        sizes = [i for i in (1, 2, 4) if i <= max_size]
    if max_size >= 8:
        sizes += list(range(8, min(max_size + 1, 256), 8))
    if max_size >= 256:
        sizes += list(range(256, max_size + 1, 16))
    if max_num_tokens <= max_size and max_num_tokens not in sizes:
        sizes.append(max_num_tokens)
    sizes += [s for s in uniform_decode_sizes if s <= max_num_tokens]
    return sorted(set(sizes))


def decode_query_lens(
    decode_query_len: int,
    *,
    max_num_seqs: int,
    num_speculative_tokens: int,
    dynamic_sd: DynamicSDSchedule | None,
) -> list[int]:
    """Query lengths a manager captures uniform decode for: one per dynamic-SD K, else one."""
    if dynamic_sd is not None and decode_query_len > num_speculative_tokens:
        per_step = decode_query_len - num_speculative_tokens
        ks = dynamic_sd_ks(dynamic_sd, max_num_seqs, num_speculative_tokens)
        return sorted(k + per_step for k in ks)
    return [decode_query_len]


def uniform_decode_requests(
    sizes: Sequence[int], *, max_size: int, max_num_seqs: int, decode_query_len: int, q: int
) -> list[int]:
    """Request counts of a manager's uniform-decode FULL graphs at query length ``q``, ascending.

    Each token size rounds up to a multiple of q; it is kept while the rounded size fits
    max_num_seqs × decode_query_len and the recorded maximum. Equal to the ``num_reqs`` of
    ``manager_descriptors``' FULL entries with ``uniform_token_count == q``.
    """
    limit = min(max_num_seqs, min(max_num_seqs * decode_query_len, max_size) // q)
    return ceil_counts(sizes, q, limit)


def ceil_counts(sizes: Sequence[int], q: int, limit: int) -> list[int]:
    """Distinct ⌈s / q⌉ ≤ ``limit`` over ascending ``sizes``, ascending."""
    # ⌈s/q⌉ ≤ limit ⟺ s ≤ limit·q, and ⌈s/q⌉ is monotone, so a prefix keeps the order
    head = sizes[: bisect.bisect_right(sizes, limit * q)]
    if q == 1:
        return list(head)
    return list(dict.fromkeys([-(-s // q) for s in head]))


@dataclass(frozen=True)
class Descriptor:
    """One capture, as ``BatchExecutionDescriptor`` (without LoRA and micro-batch fields)."""

    cg_mode: Literal["FULL", "PIECEWISE"]
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None


def manager_descriptors(
    *,
    sizes: Sequence[int],
    max_size: int,
    max_num_seqs: int,
    cudagraph_mode: CudaGraphMode,
    decode_query_len: int,
    num_speculative_tokens: int = 0,
    dynamic_sd: DynamicSDSchedule | None = None,
    varlen_decode: bool = False,
) -> dict[str, list[Descriptor]]:
    """``CudaGraphManager._init_candidates``: capture descriptors per mode, widest first.

    Args:
        sizes: the resolved cudagraph_capture_sizes.
        max_size: the resolved max_cudagraph_capture_size.
        max_num_seqs: scheduler max_num_seqs (the manager's max_num_reqs).
        cudagraph_mode: the manager's mode (a drafter's manager may get a narrower one).
        decode_query_len: the manager's q (1 + K for the target, 1 for later draft steps).
        num_speculative_tokens: K, used to recover dynamic-SD query lengths.
        dynamic_sd: the dynamic speculative-decoding schedule, if any.
        varlen_decode: adaptive verification's variable-length decode graphs.
    """
    out: dict[str, list[Descriptor]] = {}
    if cudagraph_mode == "NONE" or not sizes:
        return out
    decode_mode, mixed_mode = MODE_HALVES[cudagraph_mode]
    separate = decode_mode != mixed_mode
    max_decode_tokens = max_num_seqs * decode_query_len
    query_lens = decode_query_lens(
        decode_query_len,
        max_num_seqs=max_num_seqs,
        num_speculative_tokens=num_speculative_tokens,
        dynamic_sd=dynamic_sd,
    )
    by_mode: dict[str, list[Descriptor]] = {}
    seen: dict[str, set[Descriptor]] = {}
    capture_varlen = separate and decode_mode != "NONE" and varlen_decode
    for num_tokens in sorted(sizes):
        if capture_varlen and num_tokens <= max_decode_tokens:
            by_mode.setdefault(decode_mode, []).append(
                Descriptor(
                    "FULL", num_tokens, min(num_tokens, max_num_seqs), None, decode_query_len
                )
            )
        elif separate and decode_mode != "NONE" and not varlen_decode:
            for q in query_lens:
                rounded = -(-num_tokens // q) * q
                reqs = rounded // q
                if rounded > max_decode_tokens or rounded > max_size or reqs > max_num_seqs:
                    continue
                desc = Descriptor("FULL", rounded, reqs, q)
                mode_seen = seen.setdefault(decode_mode, set())
                if desc not in mode_seen:
                    mode_seen.add(desc)
                    by_mode.setdefault(decode_mode, []).append(desc)
        if mixed_mode != "NONE":
            reqs_mixed = min(num_tokens, max_num_seqs) if mixed_mode == "FULL" else None
            kind: Literal["FULL", "PIECEWISE"] = "FULL" if mixed_mode == "FULL" else "PIECEWISE"
            by_mode.setdefault(mixed_mode, []).append(Descriptor(kind, num_tokens, reqs_mixed))
            seen.setdefault(mixed_mode, set()).add(by_mode[mixed_mode][-1])
    for mode, descs in by_mode.items():
        # stable, as list.sort(reverse=True) in vLLM: equal widths keep insertion order
        out[mode] = sorted(descs, key=lambda d: d.num_tokens, reverse=True)
    return out


def one_token_tier_ks(
    dynamic_sd: DynamicSDSchedule | None, max_num_seqs: int, num_speculative_tokens: int
) -> list[int | None]:
    """K values that get their own one-token draft decode graphs (None: no dynamic SD).

    With dynamic SD the fused draft loop is specialized per K >= 2 of the schedule, widest first.
    """
    if dynamic_sd is None:
        return [None]
    ks = dynamic_sd_ks(dynamic_sd, max_num_seqs, num_speculative_tokens)
    return [k for k in sorted(ks - {0, 1}, reverse=True)]


@dataclass(frozen=True)
class VllmSizes:
    """vLLM 0.33.0's sizing of one PlanInput: the capture-size list, and each runner's graphs.

    Attributes:
        main: ``cudagraph_capture_sizes`` as vLLM resolves them with CUDA graphs on (the seed
            starts from them off SM100 and with legacy fields).
        runners: the graphs each CudaGraphManager captures from them under the input's mode.
    """

    main: MainSizes
    runners: RunnerSizes


_NO_SIZES = MainSizes((), 0, ())


def vllm_sizes(inp: PlanInput) -> VllmSizes:
    """The pipeline's vLLM stage: capture sizes once, then every runner's graphs from them.

    Raises:
        ConfigError: where vLLM raises or asserts (see ``capture_sizes``).
    """
    main = capture_sizes(
        sm100=inp.sm100,
        max_num_seqs=inp.max_num_seqs,
        max_num_batched_tokens=inp.max_num_batched_tokens,
        num_speculative_tokens=inp.num_speculative_tokens,
        dynamic_sd=inp.dynamic_sd,
        cudagraph_capture_sizes=inp.cudagraph_capture_sizes,
        max_cudagraph_capture_size=inp.max_cudagraph_capture_size,
        performance_mode=inp.performance_mode,
    )
    used = _NO_SIZES if inp.cudagraph_mode == "NONE" else main
    return VllmSizes(main, _runner_sizes(inp, used))


def _runner_sizes(inp: PlanInput, main: MainSizes) -> RunnerSizes:
    """Every runner draws from the one capture-size list (CudaGraphManager per runner)."""
    sizes, seqs = list(main.sizes), inp.max_num_seqs

    def tiers(decode_query_len: int) -> list[DecodeTier]:
        """Uniform-decode graphs of a manager whose query length is ``decode_query_len``."""
        k, dyn = inp.num_speculative_tokens, inp.dynamic_sd
        qs = decode_query_lens(
            decode_query_len, max_num_seqs=seqs, num_speculative_tokens=k, dynamic_sd=dyn
        )
        per_step = decode_query_len - k
        return [
            DecodeTier(
                q,
                uniform_decode_requests(
                    sizes,
                    max_size=main.max_size,
                    max_num_seqs=seqs,
                    decode_query_len=decode_query_len,
                    q=q,
                ),
                q - per_step if dyn is not None and decode_query_len > k else None,
            )
            for q in sorted(qs, reverse=True)
        ]

    mode = inp.cudagraph_mode
    if inp.adaptive_verification and mode != "FULL_DECODE_ONLY":
        mode = "FULL_AND_PIECEWISE"  # resolve_adaptive_cudagraph_mode, piecewise available
    return RunnerSizes(
        sizing="vllm-0.33.0",
        mode=mode,
        tokens=sizes,
        av_tokens=[t for t in sizes if t <= seqs * inp.q],
        decode=tiers(inp.q),
        block=tiers(inp.block_q) if inp.drafter == "block" else [],
        one_token=uniform_decode_requests(
            sizes, max_size=main.max_size, max_num_seqs=seqs, decode_query_len=1, q=1
        ),
        one_token_ks=one_token_tier_ks(inp.dynamic_sd, seqs, inp.num_speculative_tokens),
        max_size=main.max_size,
        recorded=sizes,
        warnings=list(main.warnings),
        captures=bool(sizes),
    )
