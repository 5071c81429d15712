"""The plan pipeline: flags -> PlanInput -> vLLM's sizes -> the seed's tiers -> rows.

``resolve`` and ``resolve_both`` run each stage once: vLLM 0.33.0's sizing of the input
(memest.plan.vllm033.vllm_sizes), the seed's from it where the seed is asked
(memest.plan.seed.resolve_seed), then the rows of each sizing's RunnerSizes, which read
nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

from memest.errors import ConfigError
from memest.plan.inputs import BLOCK_DRAFTERS, PlanInput
from memest.plan.seed import resolve_seed
from memest.plan.sizes import DecodeTier, RunnerSizes
from memest.plan.vllm033 import MODE_HALVES, CudaGraphMode, vllm_sizes
from memest.schema.plan import CapturePlan, GraphMode, RunnerRow, Sizing

SIZINGS: tuple[Sizing, ...] = ("seed", "vllm-0.33.0")
#: How human output names each sizing (JSON keeps the SIZINGS keys): the seed's proposal of five
#: capture fields, and vLLM 0.33.0 as released (the sizing a start on main runs).
SIZING_NAMES: dict[str, str] = {"seed": "seed", "vllm-0.33.0": "main"}
SIZING_LEGEND = "seed = the five capture fields (the seed's proposal); main = vLLM 0.33.0"

_LABELS = {
    "target.piecewise": "Target PIECEWISE: prefill, mixed, decode fallback",
    "target.full": "Target FULL: uniform verification/decode",
    "target.full_mixed": "Target FULL: every batch (FULL mode)",
    "target.av": "Target FULL varlen: adaptive verification",
    "draft.step0.piecewise": "Draft step 0 PIECEWISE",
    "draft.step0.full": "Draft step 0 FULL: after uniform target decode",
    "draft.steps.full": "Draft steps 1..K-1 FULL: one-token draft decode",
    "draft.block.full": "Drafter FULL block routine",
    "draft.mtp.full": "Multi-module MTP FULL",
    "draft.none": "Drafter runs eagerly (no graphs)",
}


def token_row(
    runner: str,
    tokens: Sequence[int],
    *,
    graph_mode: GraphMode,
    max_num_seqs: int,
    q: int = 1,
    note: str = "",
) -> RunnerRow:
    """A row whose sizes are token counts (PIECEWISE, FULL mixed, adaptive verification)."""
    sizes = sorted(tokens)
    widest = sizes[-1] if sizes else 0
    return RunnerRow(
        runner=runner,
        label=_LABELS[runner],
        graph_mode=graph_mode,
        q=q,
        graph_count=len(sizes),
        sizes=sizes,
        unit="tokens",
        widest_requests=None
        if graph_mode == "PIECEWISE" or not sizes
        else min(widest, max_num_seqs),
        widest_tokens=widest,
        sum_tokens=sum(sizes),
        note=note,
    )


def request_row(
    runner: str,
    requests: Sequence[int],
    *,
    q: int,
    tier_k: int | None = None,
    label: str | None = None,
    note: str = "",
) -> RunnerRow:
    """A row of uniform-decode graphs: n requests × q tokens each."""
    sizes = sorted(requests)
    widest = sizes[-1] if sizes else 0
    return RunnerRow(
        runner=runner,
        label=label or _LABELS[runner],
        graph_mode="FULL",
        q=q,
        graph_count=len(sizes),
        sizes=sizes,
        unit="requests",
        widest_requests=widest,
        widest_tokens=widest * q,
        sum_tokens=sum(sizes) * q,
        note=note,
        tier_k=tier_k,
    )


def _block_label(inp: PlanInput) -> str:
    return f"{BLOCK_DRAFTERS.get(inp.spec_method or '', 'Drafter')} FULL block routine"


def _tier_rows(
    runner: str, tiers: Sequence[DecodeTier], label: str | None = None
) -> list[RunnerRow]:
    return [request_row(runner, t.requests, q=t.q, tier_k=t.tier_k, label=label) for t in tiers]


def _target_rows(src: RunnerSizes, inp: PlanInput, mode: CudaGraphMode) -> list[RunnerRow]:
    decode_half, mixed_half = MODE_HALVES[mode]
    seqs = inp.max_num_seqs
    rows: list[RunnerRow] = []
    if mixed_half == "PIECEWISE":
        rows.append(
            token_row("target.piecewise", src.tokens, graph_mode="PIECEWISE", max_num_seqs=seqs)
        )
    if mode == "FULL":
        rows.append(
            token_row("target.full_mixed", src.tokens, graph_mode="FULL", max_num_seqs=seqs)
        )
    elif inp.adaptive_verification:
        rows.append(
            token_row(
                "target.av", src.av_tokens, graph_mode="FULL_VARLEN", max_num_seqs=seqs, q=inp.q
            )
        )
    elif decode_half == "FULL":
        rows.extend(_tier_rows("target.full", src.decode))
    return rows


def _drafter_rows(src: RunnerSizes, inp: PlanInput, mode: CudaGraphMode) -> list[RunnerRow]:
    decode_half, mixed_half = MODE_HALVES[mode]
    decode_full = decode_half == "FULL"
    seqs, q = inp.max_num_seqs, inp.q
    rows: list[RunnerRow] = []
    if inp.drafter == "target_dependent_ar":
        if mixed_half == "PIECEWISE":
            rows.append(
                token_row(
                    "draft.step0.piecewise",
                    src.tokens,
                    graph_mode="PIECEWISE",
                    max_num_seqs=seqs,
                    q=q,
                )
            )
        if mode == "FULL":
            rows.append(
                token_row("draft.step0.full", src.tokens, graph_mode="FULL", max_num_seqs=seqs, q=q)
            )
        elif decode_full:
            rows.extend(_tier_rows("draft.step0.full", src.decode))
        if inp.num_speculative_tokens >= 2 and decode_full:
            # With dynamic SD the fused draft loop is captured once per K >= 2 of the schedule.
            rows.extend(
                request_row("draft.steps.full", src.one_token, q=1, tier_k=tier_k)
                for tier_k in src.one_token_ks
            )
    elif inp.drafter == "multi_module_mtp":
        # Compiled piecewise graphs cannot specialize the module index: PIECEWISE is dropped.
        if mode == "FULL":
            rows.append(
                token_row("draft.mtp.full", src.tokens, graph_mode="FULL", max_num_seqs=seqs, q=q)
            )
        elif decode_full:
            rows.extend(_tier_rows("draft.mtp.full", src.decode))
    elif inp.drafter == "block":
        if decode_full:
            rows.extend(_tier_rows("draft.block.full", src.block, _block_label(inp)))
    elif inp.spec_method is not None:
        rows.append(_none_row())
    return rows


def _rows(src: RunnerSizes, inp: PlanInput) -> list[RunnerRow]:
    """The rows of one sizing: the target's, then the drafter's."""
    if not src.captures:
        return []
    return _target_rows(src, inp, src.mode) + _drafter_rows(src, inp, src.mode)


def _none_row() -> RunnerRow:
    return RunnerRow(
        runner="draft.none",
        label=_LABELS["draft.none"],
        graph_mode="NONE",
        q=1,
        graph_count=0,
        sizes=[],
        unit="requests",
        widest_requests=None,
        widest_tokens=0,
        sum_tokens=0,
    )


def _plan(inp: PlanInput, src: RunnerSizes) -> CapturePlan:
    """The rows stage: one sizing's RunnerSizes as a capture plan."""
    rows = _rows(src, inp)
    return CapturePlan(
        sizing=src.sizing,
        gpu=inp.gpu or ("sm100" if inp.sm100 else "other"),
        sm100=inp.sm100,
        max_num_seqs=inp.max_num_seqs,
        max_num_batched_tokens=inp.max_num_batched_tokens,
        speculative_method=inp.spec_method,
        num_speculative_tokens=inp.num_speculative_tokens,
        runners=rows,
        total_graphs=sum(r.graph_count for r in rows),
        max_cudagraph_capture_size=src.max_size,
        warnings=list(src.warnings),
        cudagraph_mode=inp.cudagraph_mode,
        performance_mode=inp.performance_mode,
        adaptive_verification=inp.adaptive_verification,
        dynamic_sd_schedule=None
        if inp.dynamic_sd is None
        else [list(row) for row in inp.dynamic_sd],
        cudagraph_capture_sizes=list(src.recorded),
        resolved_fields=dict(src.resolved),
    )


def resolve(inp: PlanInput, sizing: Sizing = "seed") -> CapturePlan:
    """Resolve ``inp`` into a capture plan: one RunnerRow per runner (per tier with dynamic SD).

    Args:
        inp: a validated PlanInput.
        sizing: "seed" (the five fields) or "vllm-0.33.0" (vLLM's own sizing and
            CudaGraphManager descriptors).

    Raises:
        ConfigError: an unknown sizing, or an input vLLM itself rejects.
    """
    if sizing not in SIZINGS:
        raise ConfigError("sizing", sizing, f"unknown; expected one of {list(SIZINGS)}")
    vllm = vllm_sizes(inp)
    if sizing == "vllm-0.33.0":
        return _plan(inp, vllm.runners)
    return _plan(inp, resolve_seed(inp, vllm.main))


def resolve_both(inp: PlanInput) -> tuple[CapturePlan, CapturePlan]:
    """(seed plan, vLLM 0.33.0 plan) for the same input, side by side; vLLM's sizes once."""
    vllm = vllm_sizes(inp)
    return _plan(inp, resolve_seed(inp, vllm.main)), _plan(inp, vllm.runners)
