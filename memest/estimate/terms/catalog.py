"""Every full-initialization term, one object each: its reader, the plugin's reading, its law
and the law's range.

=============================  ================================================================
term (FullInitTerms field)     law (config.json + grid; vLLM 0.33.0's code)
=============================  ================================================================
baseline_torch_bytes           input, request-state and drafter buffers (runner_buffers)
                               + custom all-reduce's rank_data (parallel) + fitted cuBLAS
                               workspaces of device init
weights_bytes                  parameter shapes x dtype bytes / TP (shape; FP8: 1 B per weight
                               + float32 scales; a hybrid architecture's own layers:
                               hybrid_terms) + penalties and structured-output masks + the
                               DSA top-k buffer + fitted rest
profile_peak_activation_bytes  the forward's law (activation; a MoE layer without its routed
                               experts' caches) + a full-batch step's sampler and prompt-logprobs
                               reserve (sampler; a start's reading adds the prompt chunk, which
                               the profile run does not allocate)
                               + MLA's profile stand-in + DSA's logits stand-in (dsa)
mla_context_bytes              MLA's / DSA's prefill over cached context beyond the sampler's
                               reserve (mla_context: the two steps combine by max)
outside_torch_bytes            fitted CUDA context + fitted graph objects per graph and layer
                               + NCCL's ring and vLLM's all-reduce buffers (parallel)
graph_pool_bytes               synthetic per-graph request trace, allocator replay
                               (synthetic_trace)
runner_buffer_bytes            block tables, one per KV-cache group (runner_buffers) + fitted
                               rest
profiling_residue_bytes        the sampler's top-k/top-p buffer, the workspace manager's one
                               buffer: the fused-MoE workspace (runner_buffers, fused_moe),
                               DSA's (dsa), TRITON_MLA's decode logits (mla_decode) + fitted line
                               in max_num_batched_tokens x hidden x dtype bytes
=============================  ================================================================

One residue definition, the plugin's and the report's: what is allocated when vLLM asks for the
KV budget (after its profiling's ``empty_cache``) beyond what was allocated before the weights
and the weights. That is how vLLM's profiling counts torch memory (torch_peak_increase from
``allocated_bytes.all.peak``, the weights as load_model's allocated growth), and the slack of
partly used segments is no term's: later allocations (runner buffers, capture outputs) fill it.
Counted by reservation it would be counted twice: the what-if from a real start (W1 in
reports/vllm/whatif.json) then lands 15 MiB further from its real start's truth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from memest.errors import ReportFormatError
from memest.estimate.activation import (
    activation_bytes,
    activation_shape,
    profile_pass_bytes,
    sampler_reserve,
)
from memest.estimate.mla_context import profile_standin_bytes, run_mla_context_bytes
from memest.estimate.model_shape import ModelShape
from memest.estimate.phases import (
    activation_headroom,
    check_report,
    device_used,
    final_reading,
    graph_pool_by_stage,
    growable_kv_bytes,
    kept_after_kv,
    kv_phase_extra_bytes,
    requested_bytes,
    require_phase,
)
from memest.estimate.profiling import ProfilingReadings, capture_details, pool_by_stage
from memest.estimate.sampler import run_serving_step_bytes
from memest.estimate.terms import dsa, mla_decode
from memest.estimate.terms.coefficients import Coefficients
from memest.estimate.terms.context import context_law, context_range
from memest.estimate.terms.setup import Setup
from memest.estimate.terms.shape import parameter_bytes
from memest.schema import (
    CapturePlan,
    FullInitTerms,
    MemoryReading,
    PhaseRecord,
    RunConfig,
    RunReport,
)

#: A law's bytes and the text that says how they were obtained.
Law = tuple[int, str]


@dataclass(frozen=True, slots=True)
class ReportReadings:
    """The phase readings of one complete start that the readers take."""

    report: RunReport
    weights: PhaseRecord
    profile: PhaseRecord
    kv_alloc: PhaseRecord
    final: MemoryReading
    shape: ModelShape | None = None  # the model's, where a report lacks its recorded dimensions

    @property
    def weights_bytes(self) -> int:
        return max(
            self.weights.end.torch_allocated_bytes - self.weights.start.torch_allocated_bytes, 0
        )

    @property
    def block_size(self) -> int:
        spec = self.report.kv_cache
        return spec.block_size if spec is not None else 16


def residue_bytes(allocated_at_kv: int, allocated_before_weights: int, weights: int) -> int:
    """The profiling residue (the one definition): allocated when the KV budget is asked, less
    what was allocated before the weights and the weights."""
    return max(allocated_at_kv - allocated_before_weights - weights, 0)


#: A mover's result: the term at G' and the law that moved it (None: kept at G's bytes).
Moved = tuple[int, str | None]


@dataclass(frozen=True)
class Move:
    """What a term's mover reads: G's terms, both grids, and what the what-if predicted once for
    several terms (the grid-sized buffers and a drafter's moves per term, the graph pools and
    the graph objects)."""

    terms: FullInitTerms
    plans: tuple[CapturePlan, CapturePlan]
    configs: tuple[RunConfig, RunConfig]
    block_size: int
    target: ModelShape | None  # the model's per-rank shape, where the what-if has it
    drafter_share: Callable[[int, str], int | None]  # a drafter's activation share at tokens
    drafter_factor: float | None = None  # the calibration's factor behind drafter_share
    deltas: Mapping[str, int] = field(default_factory=dict)  # f(G') - f(G) per term
    delta_laws: Mapping[str, str] = field(default_factory=dict)
    pools_to: int = 0
    pool_law: str = ""
    objects_change: int = 0  # graph objects outside PyTorch: predicted - measured
    notes: list[str] = field(default_factory=list)

    def shifted(self, name: str) -> Moved:
        """G's term moved by its deltas (never below 0)."""
        if name not in self.deltas:
            return int(getattr(self.terms, name)), self.delta_laws.get(name)
        return max(int(getattr(self.terms, name)) + self.deltas[name], 0), self.delta_laws.get(name)


@dataclass(frozen=True, slots=True)
class Term:
    """One full-initialization term: how it is read, measured by the plugin, predicted and
    moved to another grid."""

    field: str
    read: Callable[[ReportReadings], int]
    plugin: Callable[[ProfilingReadings], int]
    law: Callable[[Setup, Coefficients], Law]
    move: Callable[[Move], Moved]
    law_range: Callable[[Setup, Coefficients], int] = lambda s, c: 0


# --------------------------------------------------------------------------- readers
# vLLM 0.34's growable KV cache maps driver memory outside PyTorch's allocator: none of it is in
# the KV phase's allocations, all of its committed bytes are in the device's used memory.
def _read_outside(r: ReportReadings) -> int:
    used = device_used(r.final, r.report, "the final reading")
    return max(used - r.final.torch_reserved_bytes - growable_kv_bytes(r.report), 0)


def _read_runner(r: ReportReadings) -> int:
    kept = kept_after_kv(r.report, r.kv_alloc, r.final)
    return kv_phase_extra_bytes(r.report, r.kv_alloc) + kept


def _read_residue(r: ReportReadings) -> int:
    before = r.weights.start.torch_allocated_bytes
    return residue_bytes(r.kv_alloc.start.torch_allocated_bytes, before, r.weights_bytes)


# --------------------------------------------------------------------------- plugin readings
def _plugin_outside(r: ProfilingReadings) -> int:
    used_now = r.now.device_used_bytes or 0
    return (
        max(used_now - r.now.torch_reserved_bytes, 0)
        + capture_details(r)["capture_outside_torch_bytes"]
    )


def _plugin_runner(r: ProfilingReadings) -> int:
    d = capture_details(r)
    return d["profiling_runner_buffer_bytes"] + d["capture_default_pool_bytes"]


def _plugin_baseline(r: ProfilingReadings) -> int:
    return r.before_weights.torch_reserved_bytes if r.before_weights is not None else 0


def _plugin_residue(r: ProfilingReadings) -> int:
    before = r.before_weights.torch_allocated_bytes if r.before_weights is not None else 0
    return residue_bytes(r.now.torch_allocated_bytes, before, r.weights_bytes)


# --------------------------------------------------------------------------- laws
def _law_baseline(s: Setup, c: Coefficients) -> Law:
    base = c.baseline_bytes + (c.baseline_drafter_bytes if s.drafter else 0)
    base += s.parallel.inside_torch_bytes + s.buffers().get("baseline_torch_bytes", 0)
    law = f"{s.buffer_names('baseline_torch_bytes')} + fitted constant (cuBLAS workspaces)"
    return base, law + (" + custom all-reduce's rank_data" if s.parallel.inside_torch_bytes else "")


def _law_weights(s: Setup, c: Coefficients) -> Law:
    weights = s.target_weight_bytes() + c.weights_rest_bytes  # a hybrid's own layers: hybrid_terms
    if s.drafter is not None:
        weights += parameter_bytes(s.drafter, target_vocab=s.target.vocab)
    return (
        weights + s.buffers().get("weights_bytes", 0),
        f"parameter shapes x dtype bytes / TP + {s.buffer_names('weights_bytes')}",
    )


def _law_activation(s: Setup, c: Coefficients) -> Law:
    seqs, t = s.plan.max_num_seqs, s.target
    total = profile_pass_bytes(
        s.mbt, seqs, t, c.activation_factor, s.drafter, c.activation_drafter_factor
    )
    standin = t.family == "mla" and not t.index_topk  # DSA layers allocate no stand-in
    if standin:
        total += profile_standin_bytes(t, s.mla_workspace_tokens)
    total += dsa.activation_bytes(t)
    reserve = sampler_reserve(t, seqs, s.mbt)
    law = f"{c.activation_factor:.3f} x max_num_batched_tokens x layer token bytes"
    law += f" + the sampler's {seqs}-row reserve over the forward's freed segments" * bool(reserve)
    law += " (with a gated-delta-net layer's prefill of every row)" * (t.gdn is not None)
    law += " + the profile run's MLA context stand-in" * standin
    return total, law + (dsa.ACTIVATION_LAW if t.sparse else "")


def _range_activation(s: Setup, c: Coefficients) -> int:
    """The routed experts' caches, which the lab's MoE starts could not measure apart."""
    if not s.target.moe_layers:
        return 0
    full = activation_bytes(s.mbt, s.target, c.activation_factor)
    return full - activation_bytes(s.mbt, activation_shape(s.target), c.activation_factor)


def _law_context(s: Setup, c: Coefficients) -> Law:
    return context_law(s.target, s.config, s.block_size, v_padded=s.mla_v_padded)


def _range_context(s: Setup, c: Coefficients) -> int:
    return context_range(s.target, s.config, s.block_size, v_padded=s.mla_v_padded)


def _law_outside(s: Setup, c: Coefficients) -> Law:
    layers = s.graph_layers()
    outside = c.outside_bytes + c.outside_per_graph_layer_bytes * layers
    law = f"context + {c.outside_per_graph_layer_bytes:.0f} B x graphs x layers ({layers})"
    if s.parallel.parts:
        law += f" + TP's communicators ({s.parallel.describe()})"
    return round(outside + s.parallel.outside_torch_bytes), law


def _law_pools(s: Setup, c: Coefficients) -> Law:
    pools = s.pools()
    return (
        sum(pools.by_stage.values()),
        f"synthetic request trace of {s.plan.total_graphs} graphs, allocator replay"
        + dsa.pool_law(s.plan, s.target, s.indexer, pools),
    )


def _range_pools(s: Setup, c: Coefficients) -> int:
    return dsa.pool_range(s.plan, s.indexer, s.pools()) if s.indexer is not None else 0


def _law_runner(s: Setup, c: Coefficients) -> Law:
    rest = c.runner_rest_drafter_bytes if s.drafter else c.runner_rest_bytes
    return (
        rest + s.buffers().get("runner_buffer_bytes", 0),
        f"{s.buffer_names('runner_buffer_bytes')} ({s.block_size}-token blocks) + fitted constant",
    )


def _law_residue(s: Setup, c: Coefficients) -> Law:
    t = s.target
    residue = c.residue_bytes + c.residue_factor * s.mbt * t.hidden * t.dtype_bytes
    mml = s.config.max_model_len or 1
    # vLLM's workspace manager holds one buffer, grown to its largest request: the fused-MoE
    # workspace (in the grid-sized buffers), DSA's, TRITON_MLA's decode logits.
    triton = mla_decode.logits_workspace_bytes(
        t,
        s.attention_backend,
        max_num_seqs=s.config.max_num_seqs or 1,
        max_model_len=mml,
        num_speculative_tokens=s.config.num_speculative_tokens,
        sms=s.num_sms,
    )
    workspace = max(dsa.workspace_bytes(t, s.mbt, mml, s.attention_backend), triton)
    residue += max(workspace - s.buffer_sizes.get("fused_moe_workspace", 0), 0)
    if s.drafter is not None:
        residue += c.residue_drafter_bytes
    return (
        round(residue) + s.buffers().get("profiling_residue_bytes", 0),
        f"{s.buffer_names('profiling_residue_bytes')} + fitted constant + "
        f"{c.residue_factor:.3f} x max_num_batched_tokens x hidden x dtype bytes"
        + (dsa.RESIDUE_LAW if t.sparse else "")
        + (mla_decode.LAW if triton else ""),
    )


# --------------------------------------------------------------------------- movers
def _shifted(name: str) -> Callable[[Move], Moved]:
    return lambda m: m.shifted(name)


def _move_activation(m: Move) -> Moved:
    """The profile pass at G': its forward scales with max_num_batched_tokens (real vLLM,
    Llama-8B shape: 300 MiB at 2,048 tokens, 592 MiB at 4,096), the sampler's reserve is derived
    at each grid (needs the model's shape), and a drafter added or dropped adds or removes its
    share."""
    act = m.terms.profile_peak_activation_bytes
    (p, p2), (c, c2) = m.plans, m.configs
    mbt, mbt2 = p.max_num_batched_tokens, p2.max_num_batched_tokens
    had, has = c.speculative_method, c2.speculative_method
    laws: list[str] = []
    if had and not has:
        share = m.drafter_share(mbt, had)
        if share is not None:
            act = max(act - share, 0)
            laws.append(f"drafter's share removed ({share} B at G)")
    reserve = reserve2 = 0
    if m.target is not None:
        reserve = sampler_reserve(m.target, p.max_num_seqs, mbt, c.gdn_prefill_backend)
        reserve2 = sampler_reserve(m.target, p2.max_num_seqs, mbt2, c2.gdn_prefill_backend)
    if act < reserve:
        m.notes.append(
            f"activation headroom {act} B reads less than the full-batch step's derived reserve "
            f"{reserve} B: the forward is taken as 0 (the reading and the model disagree)"
        )
    forward = out = max(act - reserve, 0)
    if mbt != mbt2:
        out = round(forward * mbt2 / mbt)
        laws.insert(0, "max_num_batched_tokens")
        m.notes.append(
            f"activation headroom {forward} -> {out} B "
            f"(scales with max_num_batched_tokens {mbt} -> {mbt2})"
        )
    out += reserve2
    if reserve2 != reserve:
        laws.append(f"the sampler's {p2.max_num_seqs}-row reserve (memest.estimate.sampler)")
        m.notes.append(
            f"the full-batch sampler's reserve {reserve} -> {reserve2} B ({p.max_num_seqs} -> "
            f"{p2.max_num_seqs} rows sampled over the forward's freed segments)"
        )
    if has and not had:
        share = m.drafter_share(mbt2, has)
        if share is not None:
            out += share
            laws.append(
                f"drafter: {m.drafter_factor:.3f} x max_num_batched_tokens x its layer's token "
                "bytes"
            )
    return out, "; ".join(laws) or None


def _move_context(m: Move) -> Moved:
    """MLA's prefill over context at G' (its workspace follows max_model_len and max_num_seqs)."""
    if not m.terms.mla_context_bytes:
        return 0, None
    to = run_mla_context_bytes(m.configs[1], m.block_size)
    law = "MLA's chunked-prefill workspace (max_model_len, max_num_seqs)"
    return to, law if to != m.terms.mla_context_bytes else None


def _move_outside(m: Move) -> Moved:
    change = m.objects_change + m.deltas.get("outside_torch_bytes", 0)
    law = m.delta_laws.get("outside_torch_bytes") or (
        "graph objects (graph profiling and capture) scale with the graph count x the layers "
        "each graph holds"
    )
    return max(m.terms.outside_torch_bytes + change, 0), law


def _move_pools(m: Move) -> Moved:
    return m.pools_to, m.pool_law


TERMS: tuple[Term, ...] = (
    Term(
        "baseline_torch_bytes",
        read=lambda r: r.weights.start.torch_reserved_bytes,
        plugin=_plugin_baseline,
        law=_law_baseline,
        move=_shifted("baseline_torch_bytes"),
    ),
    Term(
        "weights_bytes",
        read=lambda r: r.weights_bytes,
        plugin=lambda r: r.weights_bytes,
        law=_law_weights,
        move=_shifted("weights_bytes"),
    ),
    Term(
        "profile_peak_activation_bytes",
        read=lambda r: (
            activation_headroom(r.report, r.profile)
            + run_serving_step_bytes(r.report.config, r.shape)
        ),
        plugin=lambda r: r.activation_bytes + r.serving_step_bytes,
        law=_law_activation,
        move=_move_activation,
        law_range=_range_activation,
    ),
    Term(
        "mla_context_bytes",
        read=lambda r: run_mla_context_bytes(r.report.config, r.block_size),
        plugin=lambda r: r.mla_context_bytes,
        law=_law_context,
        move=_move_context,
        law_range=_range_context,
    ),
    Term(
        "outside_torch_bytes",
        read=_read_outside,
        plugin=_plugin_outside,
        law=_law_outside,
        move=_move_outside,
    ),
    Term(
        "graph_pool_bytes",
        read=lambda r: sum(graph_pool_by_stage(r.report).values()),
        plugin=lambda r: pool_by_stage(r)[0],
        law=_law_pools,
        move=_move_pools,
        law_range=_range_pools,
    ),
    Term(
        "runner_buffer_bytes",
        read=_read_runner,
        plugin=_plugin_runner,
        law=_law_runner,
        move=_shifted("runner_buffer_bytes"),
    ),
    Term(
        "profiling_residue_bytes",
        read=_read_residue,
        plugin=_plugin_residue,
        law=_law_residue,
        move=_shifted("profiling_residue_bytes"),
    ),
)


def read_terms(r: ReportReadings) -> dict[str, int]:
    """Every term read from a start's phase readings."""
    return {t.field: t.read(r) for t in TERMS}


def plugin_terms(r: ProfilingReadings) -> dict[str, int]:
    """Every term from the plugin's readings around graph-memory profiling."""
    return {t.field: t.plugin(r) for t in TERMS}


def laws(s: Setup, c: Coefficients) -> dict[str, Law]:
    """Every term's predicted bytes and the law that gave them."""
    return {t.field: t.law(s, c) for t in TERMS}


def law_ranges(s: Setup, c: Coefficients) -> dict[str, int]:
    """Ranges derived from vLLM's code beyond the calibration's (0s left out)."""
    out = {t.field: t.law_range(s, c) for t in TERMS}
    return {k: v for k, v in out.items() if v}


def moved_terms(m: Move) -> tuple[dict[str, int], dict[str, str]]:
    """Every term at G' and the law of each that moved."""
    values: dict[str, int] = {}
    laws: dict[str, str] = {}
    for t in TERMS:
        values[t.field], law = t.move(m)
        if law:
            laws[t.field] = law
    return values, laws


def full_init_terms(
    report: RunReport, *, margin_bytes: int = 0, shape: ModelShape | None = None
) -> FullInitTerms:
    """Read the full-initialization terms of one complete start (each term's reader, below).

    Args:
        report: a start with at least the weights, profile_run and kv_cache_alloc phases and
            an end state (``end`` or ``capture``), a KV-cache spec and the budget.
        margin_bytes: memory to keep free on top of the measured terms.
        shape: the model's per-rank shape (a what-if's config.json) for the terms derived from
            it where the report lacks its recorded dimensions.

    Raises:
        ReportFormatError: a phase, reading or figure the model needs is missing.
    """
    check_report(report)
    if margin_bytes < 0:
        raise ReportFormatError(f"margin_bytes={margin_bytes}: must not be negative")
    readings = ReportReadings(
        report,
        require_phase(report, "weights"),
        require_phase(report, "profile_run"),
        require_phase(report, "kv_cache_alloc"),
        final_reading(report),
        shape,
    )
    return FullInitTerms(
        requested_bytes=requested_bytes(report),
        **read_terms(readings),
        graph_pool_by_stage_bytes=graph_pool_by_stage(report),
        margin_bytes=margin_bytes,
        source=f"report {report.report_id}",
    )
