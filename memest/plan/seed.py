"""The seed's sizing: five compilation-config fields with SM100 / other-GPU defaults.

Prefill (PIECEWISE) graphs are sized in tokens, uniform-decode (FULL) graphs in requests, and a
per-graph token budget bounds every uniform-decode graph (adaptive verification is exempt). Off
SM100, and whenever a legacy field is set, prefill and target decode keep vLLM 0.33.0's sizes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from memest.plan.grids import av_grid, decode_grid, prefill_grid
from memest.plan.inputs import PlanInput
from memest.plan.sizes import DecodeTier, ResolvedFields, RunnerSizes
from memest.plan.vllm033 import (
    MainSizes,
    ceil_counts,
    dynamic_sd_tiers,
    one_token_tier_ks,
)

#: Default max_prefill_cudagraph_capture_tokens on SM100 (before min with max_num_batched_tokens).
SM100_PREFILL_CAP_TOKENS = 8192
#: Interim default max_decode_cudagraph_capture_tokens on SM100.
SM100_DECODE_BUDGET_TOKENS = 4096


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


_EMPTY_MAIN = MainSizes((), 0, ())


def resolve_seed(inp: PlanInput, vllm: MainSizes) -> RunnerSizes:
    """The pipeline's seed stage: the five fields resolved for ``inp`` (module docstring).

    ``vllm`` is vLLM 0.33.0's capture-size list for the same input (memest.plan.vllm033.
    vllm_sizes), read only where it seeds the sizes: off SM100 and with legacy fields.
    """
    warnings: list[str] = []
    legacy = inp.uses_legacy_fields
    # vLLM's own list seeds the off-SM100 and legacy paths; SM100 defaults never read it.
    main_defaults = legacy or not inp.sm100
    main = vllm if main_defaults else _EMPTY_MAIN
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
    recorded_max = _recorded_max(inp, prefill, av, one_token, tiers)
    tokens = prefill if inp.cudagraph_mode != "NONE" else []
    block: list[DecodeTier] = []
    if inp.drafter == "block":
        requests = _block_requests(decode, budget, recorded_max, inp.block_q)
        block = [DecodeTier(inp.block_q, requests)]
    return RunnerSizes(
        sizing="seed",
        mode=inp.cudagraph_mode,
        tokens=tokens,
        av_tokens=av,
        decode=tiers,
        block=block,
        one_token=one_token,
        one_token_ks=one_token_tier_ks(
            inp.dynamic_sd, inp.max_num_seqs, inp.num_speculative_tokens
        ),
        max_size=recorded_max,
        recorded=sorted(set(tokens) | set(av) | {n * t.q for t in tiers for n in t.requests}),
        warnings=warnings + list(main.warnings),
        resolved=_resolved_fields(tokens, decode, tiers, budget),
    )


def _recorded_max(
    inp: PlanInput,
    prefill: list[int],
    av: list[int],
    one_token: list[int],
    tiers: list[DecodeTier],
) -> int:
    """The recorded max_cudagraph_capture_size: the widest graph of every kind captured."""
    drafts_one_token = inp.drafter == "target_dependent_ar" and inp.num_speculative_tokens >= 2
    return max(
        [0, *prefill[-1:], *av[-1:], *(one_token[-1:] if drafts_one_token else [])]
        + [t.requests[-1] * t.q for t in tiers if t.requests]
    )


def _resolved_fields(
    prefill: list[int], decode: _DecodeSource, tiers: list[DecodeTier], budget: int | None
) -> ResolvedFields:
    """The five fields as resolved, for the plan's record."""
    return {
        "max_prefill_cudagraph_capture_tokens": prefill[-1] if prefill else 0,
        "prefill_cudagraph_capture_token_sizes": list(prefill),
        "max_decode_cudagraph_capture_requests": decode.cap,
        "decode_cudagraph_capture_request_sizes": list(tiers[0].requests) if tiers else [],
        "max_decode_cudagraph_capture_tokens": budget,
    }


def _block_requests(
    decode: _DecodeSource, budget: int | None, recorded_max: int, q: int
) -> list[int]:
    """DSpark / DFlash-family request sizes at ``q``: the decode source up to the cap.

    The cap is the decode cap, the budget / q and the recorded maximum / q, whichever is
    lowest; it is always captured.
    """
    cap = min(decode.cap, recorded_max // q)
    if budget is not None:
        cap = min(cap, budget // q)
    if cap < 1 or not decode.requests:
        return []
    if decode.from_grid:
        return decode_grid(cap)
    return sorted({n for n in decode.requests if n <= cap} | {cap})


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
