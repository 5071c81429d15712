"""Graphs per runner for a resolved configuration, for the seed's sizing and vLLM 0.33.0's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memest.errors import ConfigError
from memest.plan.inputs import BLOCK_DRAFTERS, PlanInput
from memest.plan.seed import SeedSizes, one_token_tier_ks, resolve_seed, vllm_sizes
from memest.plan.vllm033 import (
    MODE_HALVES,
    CudaGraphMode,
    decode_query_lens,
    uniform_decode_requests,
)
from memest.schema.plan import CapturePlan, GraphMode, RunnerRow, Sizing
from memest.vllm_versions import resolve_version

SIZINGS: tuple[Sizing, ...] = ("seed", "vllm-0.33.0")
#: How human output names each sizing (JSON keeps the SIZINGS keys): the seed's proposal of five
#: capture fields, and vLLM 0.33.0 as released (the sizing a start on main runs).
SIZING_NAMES: dict[str, str] = {"seed": "seed", "vllm-0.33.0": "main"}
SIZING_LEGEND = "seed = the five capture fields (the seed's proposal); main = vLLM 0.33.0"

#: The capture-size rules each supported vLLM release runs (memest.vllm_versions.VERSIONS; a
#: new release is a row). 0.33.0 sizes every runner from its one list ("main"); 0.34.0 sizes
#: prefill graphs in tokens and decode graphs in requests from the five CompilationConfig fields
#: the seed proposed. Off SM100 0.34.0 resolves them as the seed does (checked against its own
#: code, tests/integration/test_vllm034_oracle.py) except a prefill grid derived from
#: max_prefill_cudagraph_capture_tokens and later draft steps under explicit decode sizes; its
#: SM100 prefill grid differs too.
SIZING_BY_VERSION: dict[str, Sizing] = {"0.33.0": "vllm-0.33.0", "0.34.0": "seed"}


def release_sizing(vllm_version: str | None = None) -> Sizing:
    """The sizing a vLLM release runs (None: the installed release, else the newest).

    Raises:
        ConfigError: the release is not supported (memest.vllm_versions names them).
    """
    return SIZING_BY_VERSION[resolve_version(vllm_version).version]


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


def _block_q(inp: PlanInput) -> int:
    # DSpark samples from the anchor: K query slots; the DFlash family adds the bonus slot.
    return inp.num_speculative_tokens if inp.spec_method == "dspark" else inp.q


def _block_label(inp: PlanInput) -> str:
    return f"{BLOCK_DRAFTERS.get(inp.spec_method or '', 'Drafter')} FULL block routine"


class _Sizes(Protocol):
    """Where one sizing takes each runner's sizes from (vLLM 0.33.0's one list, or the seed's)."""

    tokens: list[int]  # PIECEWISE and FULL-mixed token sizes
    av_tokens: list[int]  # adaptive verification's token sizes
    one_token_requests: list[int]  # later draft steps (q = 1)

    def decode_rows(self, runner: str, q: int, label: str | None = None) -> list[RunnerRow]:
        """Uniform-decode rows of a manager whose query length is q (one per dynamic-SD tier)."""
        ...

    def block_rows(self, q: int, label: str) -> list[RunnerRow]:
        """The DSpark / DFlash block routine's rows."""
        ...


@dataclass
class _MainSizes:
    """vLLM 0.33.0: every runner draws from the one capture-size list."""

    inp: PlanInput
    sizes: list[int]
    max_size: int
    tokens: list[int] = field(init=False)
    av_tokens: list[int] = field(init=False)
    one_token_requests: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.sizes
        self.av_tokens = [t for t in self.sizes if t <= self.inp.max_num_seqs * self.inp.q]
        self.one_token_requests = self._requests(decode_query_len=1, q=1)

    def _requests(self, *, decode_query_len: int, q: int) -> list[int]:
        return uniform_decode_requests(
            self.sizes,
            max_size=self.max_size,
            max_num_seqs=self.inp.max_num_seqs,
            decode_query_len=decode_query_len,
            q=q,
        )

    def decode_rows(self, runner: str, q: int, label: str | None = None) -> list[RunnerRow]:
        inp, k, dyn = self.inp, self.inp.num_speculative_tokens, self.inp.dynamic_sd
        qs = decode_query_lens(
            q, max_num_seqs=inp.max_num_seqs, num_speculative_tokens=k, dynamic_sd=dyn
        )
        rows = []
        for tier_q in sorted(qs, reverse=True):
            requests = self._requests(decode_query_len=q, q=tier_q)
            tier = tier_q - (q - k) if dyn is not None and q > k else None
            rows.append(request_row(runner, requests, q=tier_q, tier_k=tier, label=label))
        return rows

    def block_rows(self, q: int, label: str) -> list[RunnerRow]:
        return self.decode_rows("draft.block.full", q, label=label)


@dataclass
class _SeedSizes:
    """The seed's five fields: prefill tokens, decode requests per tier, a token budget."""

    sizes: SeedSizes
    tokens: list[int]
    av_tokens: list[int] = field(init=False)
    one_token_requests: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.av_tokens = list(self.sizes.av_tokens)
        self.one_token_requests = list(self.sizes.one_token_requests)

    def decode_rows(self, runner: str, q: int, label: str | None = None) -> list[RunnerRow]:
        return [
            request_row(runner, tier.requests, q=tier.q, tier_k=tier.tier_k)
            for tier in self.sizes.target_decode
        ]

    def block_rows(self, q: int, label: str) -> list[RunnerRow]:
        return [request_row("draft.block.full", self.sizes.block_requests(q), q=q, label=label)]


def _target_rows(src: _Sizes, inp: PlanInput, mode: CudaGraphMode) -> list[RunnerRow]:
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
        rows.extend(src.decode_rows("target.full", inp.q))
    return rows


def _drafter_rows(src: _Sizes, inp: PlanInput, mode: CudaGraphMode) -> list[RunnerRow]:
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
            rows.extend(src.decode_rows("draft.step0.full", q))
        if inp.num_speculative_tokens >= 2 and decode_full:
            # With dynamic SD the fused draft loop is captured once per K >= 2 of the schedule.
            rows.extend(
                request_row("draft.steps.full", src.one_token_requests, q=1, tier_k=tier_k)
                for tier_k in one_token_tier_ks(inp)
            )
    elif inp.drafter == "multi_module_mtp":
        # Compiled piecewise graphs cannot specialize the module index: PIECEWISE is dropped.
        if mode == "FULL":
            rows.append(
                token_row("draft.mtp.full", src.tokens, graph_mode="FULL", max_num_seqs=seqs, q=q)
            )
        elif decode_full:
            rows.extend(src.decode_rows("draft.mtp.full", q))
    elif inp.drafter == "block":
        if decode_full:
            rows.extend(src.block_rows(_block_q(inp), _block_label(inp)))
    elif inp.spec_method is not None:
        rows.append(_none_row())
    return rows


def _main_plan(inp: PlanInput) -> CapturePlan:
    main = vllm_sizes(inp, inp.cudagraph_mode)
    mode: CudaGraphMode = inp.cudagraph_mode
    if inp.adaptive_verification and mode != "FULL_DECODE_ONLY":
        mode = "FULL_AND_PIECEWISE"  # resolve_adaptive_cudagraph_mode with piecewise available
    rows: list[RunnerRow] = []
    if mode != "NONE" and main.sizes:
        src = _MainSizes(inp, list(main.sizes), main.max_size)
        rows = _target_rows(src, inp, mode) + _drafter_rows(src, inp, mode)
    return _plan(inp, "vllm-0.33.0", rows, main.max_size, main.sizes, main.warnings, {})


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


def _seed_plan(inp: PlanInput) -> CapturePlan:
    sizes: SeedSizes = resolve_seed(inp)
    mode = inp.cudagraph_mode
    prefill = sizes.prefill_tokens if mode != "NONE" else []
    src = _SeedSizes(sizes, list(prefill))
    rows = _target_rows(src, inp, mode) + _drafter_rows(src, inp, mode)
    resolved: dict[str, int | list[int] | None] = {
        "max_prefill_cudagraph_capture_tokens": prefill[-1] if prefill else 0,
        "prefill_cudagraph_capture_token_sizes": list(prefill),
        "max_decode_cudagraph_capture_requests": sizes.decode_cap_requests,
        "decode_cudagraph_capture_request_sizes": list(sizes.target_decode[0].requests)
        if sizes.target_decode
        else [],
        "max_decode_cudagraph_capture_tokens": sizes.budget_tokens,
    }
    recorded_sizes = sorted(
        set(prefill)
        | set(sizes.av_tokens)
        | {n * t.q for t in sizes.target_decode for n in t.requests}
    )
    return _plan(
        inp, "seed", rows, sizes.recorded_max_tokens, recorded_sizes, sizes.warnings, resolved
    )


def _plan(
    inp: PlanInput,
    sizing: Sizing,
    rows: list[RunnerRow],
    max_size: int,
    recorded: Sequence[int],
    warnings: Sequence[str],
    resolved: dict[str, int | list[int] | None],
) -> CapturePlan:
    return CapturePlan(
        sizing=sizing,
        gpu=inp.gpu or ("sm100" if inp.sm100 else "other"),
        sm100=inp.sm100,
        max_num_seqs=inp.max_num_seqs,
        max_num_batched_tokens=inp.max_num_batched_tokens,
        speculative_method=inp.spec_method,
        num_speculative_tokens=inp.num_speculative_tokens,
        runners=rows,
        total_graphs=sum(r.graph_count for r in rows),
        max_cudagraph_capture_size=max_size,
        warnings=list(warnings),
        cudagraph_mode=inp.cudagraph_mode,
        performance_mode=inp.performance_mode,
        adaptive_verification=inp.adaptive_verification,
        dynamic_sd_schedule=None
        if inp.dynamic_sd is None
        else [list(row) for row in inp.dynamic_sd],
        cudagraph_capture_sizes=list(recorded),
        resolved_fields=resolved,
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
    if sizing == "seed":
        return _seed_plan(inp)
    if sizing == "vllm-0.33.0":
        return _main_plan(inp)
    raise ConfigError("sizing", sizing, f"unknown; expected one of {list(SIZINGS)}")


def resolve_both(inp: PlanInput) -> tuple[CapturePlan, CapturePlan]:
    """(seed plan, vLLM 0.33.0 plan) for the same input, side by side."""
    return _seed_plan(inp), _main_plan(inp)
