"""The seed's sizing: five compilation-config fields with SM100 / other-GPU defaults.

Prefill (PIECEWISE) graphs are sized in tokens, uniform-decode (FULL) graphs in requests, and a
per-graph token budget bounds every uniform-decode graph (adaptive verification is exempt). Off
SM100, and whenever a legacy field is set, prefill and target decode keep vLLM 0.33.0's sizes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from memest.plan.grids import av_grid, decode_grid, prefill_grid
from memest.plan.inputs import PlanInput
from memest.plan.vllm033 import (
    CudaGraphMode,
    MainSizes,
    capture_sizes,
    ceil_counts,
    dynamic_sd_ks,
    dynamic_sd_tiers,
)

#: Default max_prefill_cudagraph_capture_tokens on SM100 (before min with max_num_batched_tokens).
SM100_PREFILL_CAP_TOKENS = 8192
#: Interim default max_decode_cudagraph_capture_tokens on SM100.
SM100_DECODE_BUDGET_TOKENS = 4096


@dataclass(frozen=True)
class DecodeTier:
    """Target uniform-decode request sizes at one query length."""

    q: int
    requests: list[int]
    tier_k: int | None = None


@dataclass
class SeedSizes:
    """The seed's resolved sizes for every runner kind.

    Attributes:
        prefill_tokens: PIECEWISE token sizes (also FULL mixed sizes in FULL mode).
        target_decode: uniform-decode request sizes per tier (one tier without dynamic SD).
        decode_cap_requests: resolved max_decode_cudagraph_capture_requests at q = 1 + K.
        budget_tokens: resolved max_decode_cudagraph_capture_tokens (None: no budget).
        one_token_requests: later draft steps' request sizes (q = 1).
        av_tokens: adaptive-verification token sizes.
        recorded_max_tokens: the recorded max_cudagraph_capture_size (all graph kinds).
        main: vLLM 0.33.0's resolution of the same input where it seeds the sizes (off SM100,
            legacy fields); empty on SM100 defaults.
        warnings: dropped entries and clipped caps, each naming the field.
    """

    prefill_tokens: list[int]
    target_decode: list[DecodeTier]
    decode_cap_requests: int
    decode_source: list[int]
    decode_from_grid: bool
    budget_tokens: int | None
    one_token_requests: list[int]
    av_tokens: list[int]
    recorded_max_tokens: int
    main: MainSizes
    warnings: list[str] = field(default_factory=list)

    def block_requests(self, q: int) -> list[int]:
        """DSpark / DFlash-family request sizes at ``q``: the decode source up to the cap.

        The cap is the decode cap, the budget / q and the recorded maximum / q, whichever is
        lowest; it is always captured.
        """
        cap = min(self.decode_cap_requests, self.recorded_max_tokens // q)
        if self.budget_tokens is not None:
            cap = min(cap, self.budget_tokens // q)
        if cap < 1 or not self.decode_source:
            return []
        if self.decode_from_grid:
            return decode_grid(cap)
        return sorted({n for n in self.decode_source if n <= cap} | {cap})


_EMPTY_MAIN = MainSizes((), 0, ())


def _main_request_counts(main: MainSizes, q: int, max_num_seqs: int) -> list[int]:
    """vLLM 0.33.0's uniform-decode request counts at ``q``, capped at max_num_seqs.

    Each token size rounds up to a multiple of q within the recorded maximum; the request cap is
    the widest of those, limited to max_num_seqs, and is always captured.
    """
    counts = ceil_counts(main.sizes, q, main.max_size // q)
    if not counts:
        return []
    cap = min(max_num_seqs, counts[-1])
    kept = counts[: bisect.bisect_right(counts, cap)]
    if kept[-1:] != [cap]:
        kept.append(cap)
    return kept


def _drop_oversized(
    name: str, sizes: tuple[int, ...], limit: int, limit_name: str, warnings: list[str]
) -> list[int]:
    kept = [s for s in sizes if s <= limit]
    dropped = [s for s in sizes if s > limit]
    if dropped:
        warnings.append(f"{name}: dropped {dropped} above {limit_name}={limit}")
    return kept


def _clip_cap(name: str, cap: int, limit: int, limit_name: str, warnings: list[str]) -> int:
    if cap > limit:
        warnings.append(f"{name}={cap} lowered to {limit_name}={limit}")
        return limit
    return cap


def vllm_sizes(inp: PlanInput, mode: CudaGraphMode = "FULL_AND_PIECEWISE") -> MainSizes:
    """vLLM 0.33.0's capture sizes for ``inp`` under a cudagraph mode."""
    return capture_sizes(
        sm100=inp.sm100,
        max_num_seqs=inp.max_num_seqs,
        max_num_batched_tokens=inp.max_num_batched_tokens,
        num_speculative_tokens=inp.num_speculative_tokens,
        dynamic_sd=inp.dynamic_sd,
        cudagraph_capture_sizes=inp.cudagraph_capture_sizes,
        max_cudagraph_capture_size=inp.max_cudagraph_capture_size,
        performance_mode=inp.performance_mode,
        cudagraph_mode=mode,
    )


def resolve_seed(inp: PlanInput) -> SeedSizes:
    """Resolve the seed's five fields for ``inp`` (see the module docstring)."""
    warnings: list[str] = []
    legacy = inp.uses_legacy_fields
    # vLLM's own list seeds the off-SM100 and legacy paths; SM100 defaults never read it.
    main_defaults = legacy or not inp.sm100
    main = vllm_sizes(inp) if main_defaults else _EMPTY_MAIN
    if legacy:
        warnings.append(
            "cudagraph_capture_sizes / max_cudagraph_capture_size are deprecated: they "
            "initialize both prefill and decode sizes"
        )
    budget = inp.max_decode_cudagraph_capture_tokens
    if budget is None and inp.sm100 and not legacy:
        budget = SM100_DECODE_BUDGET_TOKENS
    prefill = _prefill_tokens(inp, main, main_defaults, warnings)
    decode = _decode_source(inp, main, main_defaults, warnings)
    tiers = _target_decode_tiers(inp, main, decode, budget)
    one_token = _one_token_requests(inp, decode, budget)
    # Adaptive verification: dense token grid to decode cap × q, exempt from the budget.
    av: list[int] = []
    if inp.adaptive_verification and decode.cap > 0:
        av = av_grid(min(decode.cap * inp.q, inp.max_num_batched_tokens))
    # The recorded maximum covers every graph kind this configuration captures.
    drafts_one_token = inp.drafter == "target_dependent_ar" and inp.num_speculative_tokens >= 2
    recorded = max(
        [0, *prefill[-1:], *av[-1:], *(one_token[-1:] if drafts_one_token else [])]
        + [t.requests[-1] * t.q for t in tiers if t.requests]
    )
    return SeedSizes(
        prefill_tokens=prefill,
        target_decode=tiers,
        decode_cap_requests=decode.cap,
        decode_source=decode.requests,
        decode_from_grid=decode.from_grid,
        budget_tokens=budget,
        one_token_requests=one_token,
        av_tokens=av,
        recorded_max_tokens=recorded,
        main=main,
        warnings=warnings + list(main.warnings),
    )


def _prefill_tokens(
    inp: PlanInput, main: MainSizes, main_defaults: bool, warnings: list[str]
) -> list[int]:
    """Prefill (PIECEWISE) capture sizes, in tokens."""
    mnbt = inp.max_num_batched_tokens
    interactivity = inp.performance_mode == "interactivity"
    if inp.prefill_cudagraph_capture_token_sizes is not None:
        return _drop_oversized(
            "prefill_cudagraph_capture_token_sizes",
            inp.prefill_cudagraph_capture_token_sizes,
            mnbt,
            "max_num_batched_tokens",
            warnings,
        )
    if inp.max_prefill_cudagraph_capture_tokens is not None:
        cap = _clip_cap(
            "max_prefill_cudagraph_capture_tokens",
            inp.max_prefill_cudagraph_capture_tokens,
            mnbt,
            "max_num_batched_tokens",
            warnings,
        )
        return prefill_grid(cap, interactivity=interactivity)
    if main_defaults:
        return list(main.sizes)
    return prefill_grid(min(SM100_PREFILL_CAP_TOKENS, mnbt), interactivity=interactivity)


@dataclass(frozen=True)
class _DecodeSource:
    """The request counts target decode graphs are drawn from, their cap, and whether they are
    the seed's own grid (rebuilt per tier) rather than a given or vLLM-derived list."""

    requests: list[int]
    cap: int
    from_grid: bool


def _decode_source(
    inp: PlanInput, main: MainSizes, main_defaults: bool, warnings: list[str]
) -> _DecodeSource:
    """Target uniform decode, in requests at q = 1 + K."""
    seqs = inp.max_num_seqs
    if inp.decode_cudagraph_capture_request_sizes is not None:
        given = _drop_oversized(
            "decode_cudagraph_capture_request_sizes",
            inp.decode_cudagraph_capture_request_sizes,
            seqs,
            "max_num_seqs",
            warnings,
        )
        return _DecodeSource(given, given[-1] if given else 0, False)
    if inp.max_decode_cudagraph_capture_requests is not None or not main_defaults:
        requested = inp.max_decode_cudagraph_capture_requests
        cap = (
            seqs
            if requested is None
            else _clip_cap(
                "max_decode_cudagraph_capture_requests", requested, seqs, "max_num_seqs", warnings
            )
        )
        return _DecodeSource(decode_grid(cap), cap, True)
    counts = _main_request_counts(main, inp.q, seqs)
    return _DecodeSource(counts, counts[-1] if counts else 0, False)


def _target_decode_tiers(
    inp: PlanInput, main: MainSizes, decode: _DecodeSource, budget: int | None
) -> list[DecodeTier]:
    """One decode tier at q = 1 + K, or one per K of a dynamic-SD schedule."""
    given = inp.decode_cudagraph_capture_request_sizes is not None

    def limited(tier_q: int, widest: int) -> list[int]:
        cap = min(decode.cap, widest)
        if budget is not None:
            cap = min(cap, budget // tier_q)
        if cap < 1 or not decode.requests:
            return []
        if decode.from_grid:
            return decode_grid(cap)
        kept = [n for n in decode.requests if n <= cap]
        if not given:
            kept = sorted(set(kept) | {cap})
        return kept

    q, seqs = inp.q, inp.max_num_seqs
    if inp.dynamic_sd is None or q <= 1:
        return [DecodeTier(q, limited(q, seqs))]
    tiers: list[DecodeTier] = []
    for tier_q, widest in dynamic_sd_tiers(inp.dynamic_sd, seqs, inp.num_speculative_tokens):
        tier_source = (
            limited(tier_q, widest)
            if decode.from_grid or given
            else [n for n in _main_request_counts(main, tier_q, seqs) if n <= widest]
        )
        tiers.append(DecodeTier(tier_q, tier_source, tier_q - 1))
    return tiers


def _one_token_requests(inp: PlanInput, decode: _DecodeSource, budget: int | None) -> list[int]:
    """Later draft steps (q = 1): their own grid to max_num_seqs on every GPU, common budget."""
    if inp.decode_cudagraph_capture_request_sizes is not None:
        return [n for n in decode.requests if budget is None or n <= budget]
    one_cap = inp.max_num_seqs if budget is None else min(inp.max_num_seqs, budget)
    return decode_grid(one_cap)


def one_token_tier_ks(inp: PlanInput) -> list[int | None]:
    """K values that get their own one-token draft decode graphs (None: no dynamic SD).

    With dynamic SD the fused draft loop is specialized per K ≥ 2 of the schedule, widest first.
    """
    if inp.dynamic_sd is None:
        return [None]
    ks = dynamic_sd_ks(inp.dynamic_sd, inp.max_num_seqs, inp.num_speculative_tokens)
    tiers: list[int | None] = [k for k in sorted(ks - {0, 1}, reverse=True)]
    return tiers
