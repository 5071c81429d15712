"""What-if: from one measured breakdown under grid G, predict pool memory under grid G'.

Each (stage, owner) pool growth scales with the one quantity of the capture plan that sizes it:

=========================  ======================================================================
owner                      scales with
=========================  ======================================================================
indexer_logits_*           widest FULL rows (requests x q) x context (context: unchanged)
aux_hidden_states          sum of PIECEWISE captured tokens (one retained output per size)
draft_logits               widest draft rows x vocabulary (vocabulary: unchanged)
graph_objects              graphs x the decoder layers each holds (outside the pool: CUDA
                           graph objects; a one-layer drafter graph is far cheaper)
workspaces, other owners   widest captured tokens of the stage's runner
kv_cache, weights          nothing (not graph memory)
=========================  ======================================================================

Pool growth is made of allocator segments, so a byte ratio can miss by a segment per trigger
(-35 % for compiled pieces from a 256-token grid to a 64-token one on vLLM 0.33.0). Given the G
snapshot, the pool rows come from memest.estimate.poolreplay instead (law "allocator_replay"):
G's requests, resized graph by graph for G', through a model of the caching allocator.
Stages G did not capture (an added drafter's; its later steps when K changes) have no requests
in G's report: given the model's shape they come from the synthetic per-graph trace (law
"synthetic_trace", memest.estimate.whatif_synthetic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from memest.analysis.owners import COMPILED_PIECE, CUBLAS_WORKSPACE
from memest.errors import ConfigError, ReportFormatError
from memest.estimate.inverse import concurrency_at
from memest.estimate.kv import kv_bytes_per_token, kv_tokens, layer_kv_bytes, require_fit
from memest.estimate.mla_context import run_mla_context_bytes
from memest.estimate.phases import (
    budget_bytes,
    full_init_kv_budget,
    full_init_terms,
    non_kv_bytes,
    phase,
    total_bytes,
)
from memest.estimate.poolreplay import pool_trace, replay
from memest.estimate.runner_buffers import (
    BUFFER_TERMS,
    ModelDims,
    RunnerGrid,
    runner_buffer_bytes,
)
from memest.estimate.whatif_synthetic import (
    Shapes,
    drafter_activation,
    shapes,
    synthetic_rows,
    unrecorded_stages,
)
from memest.schema import (
    CapturePlan,
    FullInitTerms,
    KVCacheSpec,
    OwnerPrediction,
    RunConfig,
    RunnerRow,
    RunReport,
    WhatIf,
)
from memest.schema.estimate import ScalingLaw
from memest.snapshot.format import Snapshot

GRAPH_OBJECTS = "graph_objects"
#: Compiled drafter models that keep a default-pool workspace (vLLM 0.33.0 EAGLE3: the step-0
#: PIECEWISE model and the later-step FULL model; real H200 starts C and E).
DRAFTER_COMPILED_MODELS = 2
_CONSTANT_OWNERS = ("kv_cache", "weights")


def law_for(owner: str) -> ScalingLaw:
    """The scaling law of an owner (see the module docstring)."""
    if owner.startswith("indexer_logits"):
        return "widest_full_rows_x_context"
    if owner.startswith("aux_hidden_states"):
        return "sum_piecewise_tokens"
    if owner.startswith("draft_logits"):
        return "widest_draft_rows_x_vocab"
    if owner == GRAPH_OBJECTS:
        return "graph_count_x_layers"
    if owner in _CONSTANT_OWNERS:
        return "constant"
    return "widest_tokens"


def _quantity(row: RunnerRow, law: ScalingLaw) -> int:
    if law == "sum_piecewise_tokens":
        return row.sum_tokens
    if law in ("graph_count", "graph_count_x_layers"):
        return row.graph_count
    return row.widest_tokens


def _validation_message(exc: ValidationError) -> tuple[str, object, str]:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "grid"
    return f"grid.{loc}", err.get("input"), str(err.get("msg", "invalid"))


def check_plan(plan: CapturePlan, name: str = "grid") -> CapturePlan:
    """Refuse a plan whose rows contradict themselves.

    Raises:
        ConfigError: a runner's graph count differs from its sizes, sizes are not positive and
            increasing, a runner id repeats, or total_graphs is not the sum of the rows.
    """
    seen: set[str] = set()
    for i, row in enumerate(plan.runners):
        where = f"{name}.runners[{i}]"
        if row.runner in seen:
            raise ConfigError(f"{where}.runner", row.runner, "runner listed twice")
        seen.add(row.runner)
        if row.graph_count != len(row.sizes):
            raise ConfigError(
                f"{where}.graph_count", row.graph_count, f"{len(row.sizes)} sizes are listed"
            )
        increasing = all(a < b for a, b in zip(row.sizes, row.sizes[1:], strict=False))
        if any(s <= 0 for s in row.sizes) or not increasing:
            raise ConfigError(f"{where}.sizes", row.sizes, "sizes must be positive and increasing")
    total = sum(r.graph_count for r in plan.runners)
    if plan.total_graphs != total:
        raise ConfigError(f"{name}.total_graphs", plan.total_graphs, f"runners hold {total} graphs")
    return plan


def _plan_from_input(grid: Mapping[str, Any]) -> CapturePlan:
    """Resolve ``{"sizing": ..., <memest.plan.PlanInput fields>}`` with memest.plan."""
    from memest.plan import PlanInput, resolve

    fields = dict(grid)
    sizing = fields.pop("sizing", "vllm-0.33.0")
    known = {f.name for f in dataclasses.fields(PlanInput)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(
            f"grid.{unknown[0]}", fields[unknown[0]], "not a capture-plan input field"
        )
    for key, value in fields.items():
        if isinstance(value, list):
            fields[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    try:
        inp = PlanInput(**fields)
    except TypeError as exc:
        raise ConfigError("grid", grid, str(exc)) from None
    return resolve(inp, sizing)


def resolve_grid(grid: CapturePlan | Mapping[str, Any]) -> CapturePlan:
    """A capture plan for G'.

    Args:
        grid: a CapturePlan; its JSON (an object with ``runners``); or memest.plan input fields
            (``sm100``, ``max_num_seqs``, ``max_num_batched_tokens``, ... plus ``sizing``,
            default ``vllm-0.33.0``), resolved with ``memest.plan.resolve``.

    Raises:
        ConfigError: naming the first field that fails validation.
    """
    if isinstance(grid, CapturePlan):
        return check_plan(grid)
    if not isinstance(grid, Mapping):
        raise ConfigError("grid", type(grid).__name__, "expected a capture plan (JSON object)")
    if "runners" not in grid:
        return check_plan(_plan_from_input(grid))
    try:
        plan = CapturePlan.model_validate(dict(grid))
    except ValidationError as exc:
        raise ConfigError(*_validation_message(exc)) from None
    return check_plan(plan)


def is_overlay(grid: object) -> bool:
    """A grid written as changes to the start's configuration (vLLM's flag names).

    A full capture plan has ``runners``; memest.plan input fields come with ``sizing`` or
    ``sm100``; anything else is an overlay (whose unknown fields are errors).
    """
    return isinstance(grid, Mapping) and not {"runners", "sizing", "sm100"} & set(grid)


def overlay_grid(report: RunReport, changes: Mapping[str, Any]) -> tuple[CapturePlan, RunConfig]:
    """G' as the start's configuration with ``changes``, and its capture plan (vLLM's sizing).

    Raises:
        ConfigError: an unknown field or a refused value, named.
    """
    from memest.plan import resolve
    from memest.plan.overlay import is_sm100, overlay_config, plan_input

    try:
        config = overlay_config(report.config, changes)
    except ConfigError as exc:  # every refusal named as the grid field it came from
        field = exc.field if exc.field.startswith("grid") else f"grid.{exc.field}"
        raise ConfigError(field, exc.value, exc.reason) from None
    gpu = report.gpu.name if report.gpu is not None else ""
    plan = resolve(plan_input(config, sm100=is_sm100(report.gpu), gpu=gpu), "vllm-0.33.0")
    return check_plan(plan), config


def measured_plan(report: RunReport) -> CapturePlan:
    """The capture plan of the measured run (vLLM's own sizing when several are listed)."""
    if not report.capture_plans:
        raise ReportFormatError(
            f"report {report.report_id}: capture_plans is empty, so grid G is unknown"
        )
    for plan in report.capture_plans:
        if plan.sizing == "vllm-0.33.0":
            return check_plan(plan, "report.capture_plans")
    return check_plan(report.capture_plans[0], "report.capture_plans")


def _retained(report: RunReport) -> dict[tuple[str, str], int]:
    """Bytes still live at the end of init per (stage, owner), from the breakdown's retained rows."""
    kept: dict[tuple[str, str], int] = {}
    if report.breakdown is not None:
        for r in report.breakdown.retained:
            if r.phase == "capture":
                kept[(r.stage, r.owner)] = kept.get((r.stage, r.owner), 0) + r.bytes
    return kept


def _owner_rows(report: RunReport) -> list[tuple[str, str, int]]:
    """(stage, owner, pool growth) of the real capture, summed per stage and owner."""
    bd = report.breakdown
    if bd is None:
        raise ReportFormatError(f"report {report.report_id}: breakdown is missing")
    rows: dict[tuple[str, str], int] = {}
    for t in bd.triggers:
        if t.phase != "capture":
            continue
        rows[(t.stage, t.owner)] = rows.get((t.stage, t.owner), 0) + t.bytes
    for s in bd.stages:
        if s.phase != "capture":
            continue
        charged = sum(b for (stage, _), b in rows.items() if stage == s.stage)
        rest = s.pool_growth_bytes - charged
        if rest > 0:
            rows[(s.stage, f"unattributed:{s.stage}")] = rest
    return [(stage, owner, b) for (stage, owner), b in rows.items()]


def _outside_growth(report: RunReport, name: str) -> int:
    record = phase(report, name)
    if record is None:
        return 0
    start, end = record.start, record.end
    if start.device_used_bytes is None or end.device_used_bytes is None:
        return 0
    before = start.device_used_bytes - start.torch_reserved_bytes
    after = end.device_used_bytes - end.torch_reserved_bytes
    return max(after - before, 0)


def _graph_object_bytes(report: RunReport) -> int:
    """Outside-PyTorch growth while graphs are captured (graph objects and driver memory).

    vLLM 0.33.0 captures every graph once during graph-memory profiling and again in the real
    capture; the driver memory of the graph objects grows in the first (real H200 starts:
    178 MiB for 54 graphs, 54 MiB for 18) and stays, so both windows count.
    """
    profiling = (
        "graph_profiling.total" if phase(report, "graph_profiling.total") else ("graph_profiling")
    )
    splits = [] if report.breakdown is None else report.breakdown.phases
    capture = next((s.outside_torch_bytes for s in splits if s.phase == "capture"), None)
    if capture is None:
        capture = _outside_growth(report, "capture")
    return _outside_growth(report, profiling) + max(capture, 0)


def _layer_counts(report: RunReport, dims: ModelDims | None) -> tuple[int, int]:
    """Decoder layers a target graph and a drafter graph hold: from the model's dimensions, else
    the KV-cache spec's layers (less the drafter's one) and one layer per drafter graph."""
    target = dims.num_layers if dims is not None else None
    drafter = dims.drafter_layers if dims is not None else None
    if target is None and report.kv_cache is not None and report.kv_cache.num_layers:
        target = report.kv_cache.num_layers - (1 if report.config.speculative_method else 0)
    return max(target or 1, 1), max(drafter or 1, 1)


def graph_layers(plan: CapturePlan, target_layers: int, drafter_layers: int) -> int:
    """Graphs x the decoder layers each holds, summed over a plan's runners."""
    return sum(
        r.graph_count * (drafter_layers if r.runner.startswith("draft") else target_layers)
        for r in plan.runners
    )


def _graph_objects(
    report: RunReport, measured: int, g: CapturePlan, g2: CapturePlan, dims: ModelDims | None
) -> OwnerPrediction:
    """Graph objects outside PyTorch, charged per captured graph by the layers it holds.

    A graph's driver memory follows its kernel nodes, and those its layers: a one-layer EAGLE
    drafter's graph costs about 1/32 of a Llama-8B target graph (real H200 starts: 54 target
    graphs 934.8 MiB outside PyTorch, 18 graphs 810.8 MiB; adding 95 drafter graphs and 30
    target graphs +104 MiB, where a raw graph count predicts +412 MiB).
    """
    target_layers, drafter_layers = _layer_counts(report, dims)
    before = graph_layers(g, target_layers, drafter_layers)
    after = graph_layers(g2, target_layers, drafter_layers)
    factor = after / before if before else 1.0
    return OwnerPrediction(
        stage="capture",
        owner=GRAPH_OBJECTS,
        law="graph_count_x_layers",
        measured_bytes=measured,
        factor=factor,
        predicted_bytes=round(measured * factor),
        note=f"{before} -> {after} graph-layers ({target_layers} per target graph, "
        f"{drafter_layers} per drafter graph)",
    )


def runner_text(runner: str) -> str:
    """A runner id as a reader says it: ``target.piecewise`` -> ``target PIECEWISE``."""
    *where, mode = runner.split(".")
    mode = mode.upper() if mode in ("piecewise", "full") else mode
    return " ".join([*where, mode])


def describe_grid(plan: CapturePlan, max_model_len: int | None = None) -> str:
    """A grid in words: its scheduler limits and, per runner, how many graphs up to what size."""
    limits = [
        f"max_num_seqs {plan.max_num_seqs}" if plan.max_num_seqs else "",
        f"max_num_batched_tokens {plan.max_num_batched_tokens}"
        if plan.max_num_batched_tokens
        else "",
        f"max_model_len {max_model_len}" if max_model_len else "",
    ]
    rows = "; ".join(
        f"{runner_text(r.runner)}: {r.graph_count} graph{'s' if r.graph_count != 1 else ''} "
        f"up to {r.widest_tokens} tokens"
        for r in plan.runners
    )
    sizing = "" if plan.sizing == "vllm-0.33.0" else f" ({plan.sizing} sizing)"
    return f"{', '.join(x for x in limits if x)}{sizing}: {rows or 'no graphs'}"


def _predict(
    stage: str, owner: str, measured: int, g: CapturePlan, g2: CapturePlan, retained: int = 0
) -> OwnerPrediction:
    law = law_for(owner)

    def made(factor: float, predicted_bytes: int, note: str = "") -> OwnerPrediction:
        return OwnerPrediction(
            stage=stage,
            owner=owner,
            law=law,
            measured_bytes=measured,
            factor=factor,
            predicted_bytes=predicted_bytes,
            note=note,
        )

    if law == "constant":
        return made(1.0, measured)
    if law in ("graph_count", "graph_count_x_layers"):
        before, after = g.total_graphs, g2.total_graphs
    else:
        row_g = {r.runner: r for r in g.runners}.get(stage)
        row_g2 = {r.runner: r for r in g2.runners}.get(stage)
        if row_g is None:
            return made(1.0, measured, f"stage {stage} is not a runner of grid G: kept")
        if row_g2 is None:
            return made(0.0, 0, f"grid G' captures no {stage} graphs")
        before, after = _quantity(row_g, law), _quantity(row_g2, law)
    if before == 0:
        return made(1.0, measured, "the law's quantity is 0 under G: kept")
    factor = after / before
    base, note = measured, ""
    if law == "sum_piecewise_tokens" and retained > measured:
        # Under G part of the retained outputs landed in space freed by transient buffers; that
        # slack is bounded by the widest transient, not by the sum, so scale what stays live.
        base = retained
        note = f"scaled from {retained} B retained, not {measured} B of pool growth"
    return made(factor, round(base * factor), note)


def _stage_ratio(stage: str, g: CapturePlan, g2: CapturePlan) -> float:
    """Widest size of a stage under G' over G (the widest replayed graph's scale)."""
    row_g = {r.runner: r for r in g.runners}.get(stage)
    row_g2 = {r.runner: r for r in g2.runners}.get(stage)
    if row_g is None or not row_g.sizes:
        return 1.0
    return max(row_g2.sizes) / max(row_g.sizes) if row_g2 is not None and row_g2.sizes else 0.0


def _replayed(
    rows: list[tuple[str, str, int]],
    snapshot: Snapshot,
    g: CapturePlan,
    g2: CapturePlan,
    source: str,
) -> tuple[list[OwnerPrediction], list[str]]:
    """Pool rows by allocator replay of the G snapshot.

    The measured rows come from the snapshot too, charged with today's owner rules, so measured
    and predicted name the same owners even when the report was written with older rules; the
    report's rows only check that the snapshot belongs to it.
    """
    trace = pool_trace(snapshot, g, source=source)
    report_stage: dict[str, int] = {}
    for stage, _, b in rows:
        report_stage[stage] = report_stage.get(stage, 0) + b
    notes: list[str] = []
    for stage, b in report_stage.items():
        if trace.stage_bytes(stage) == 0 and b:
            raise ReportFormatError(
                f"{source}: no graph-pool growth of stage {stage} in the capture phase, but the "
                f"report measured {b} B; is this the snapshot of the same start?"
            )
        if trace.stage_bytes(stage) != b:
            notes.append(
                f"{source} grew {trace.stage_bytes(stage)} B for {stage}, the report {b} B"
            )
    to, again = replay(trace, g2), replay(trace, g)
    for stage in trace.stages:
        if again.stage_bytes(stage) != trace.stage_bytes(stage):
            # The replay is trusted because it reproduces G; say so when it does not.
            notes.append(
                f"allocator replay of G gives {again.stage_bytes(stage)} B for {stage}, the "
                f"snapshot reserved {trace.stage_bytes(stage)} B"
            )
    keys = list(trace.measured) + [k for k in to.bytes_by_owner if k not in trace.measured]
    out: list[OwnerPrediction] = []
    for stage, owner in keys:
        measured = trace.measured.get((stage, owner), 0)
        if stage not in trace.stages:  # growth outside any graph of G: nothing to replay
            out.append(_predict(stage, owner, measured, g, g2, 0))
            continue
        predicted = to.bytes_by_owner.get((stage, owner), 0)
        out.append(
            OwnerPrediction(
                stage=stage,
                owner=owner,
                law="allocator_replay",
                measured_bytes=measured,
                factor=predicted / measured if measured else 0.0,
                predicted_bytes=predicted,
                note=f"{to.segments_by_stage.get(stage, 0)} segments for "
                f"{to.graphs_by_stage.get(stage, 0)} graphs (widest graph x"
                f"{_stage_ratio(stage, g, g2):.3f})",
            )
        )
    return out, notes


def pool_predictions(
    report: RunReport,
    grid: CapturePlan | Mapping[str, Any],
    *,
    snapshot: Snapshot | None = None,
    snapshot_source: str = "snapshot",
    dims: ModelDims | None = None,
) -> tuple[list[OwnerPrediction], list[str]]:
    """The graph-pool rows of :func:`what_if` and their notes, without the KV budget.

    Needs the report's capture plan and breakdown only, not the phases the KV budget reads.
    Without a snapshot but with the model's dimensions, the stages both grids capture move by
    the synthetic request trace's difference, as in :func:`what_if`.

    Raises:
        ConfigError: the grid fails validation.
        ReportFormatError: see :func:`what_if`.
    """
    g2 = resolve_grid(grid)
    g = measured_plan(report)
    rows = _owner_rows(report)
    if snapshot is not None:
        return _replayed(rows, snapshot, g, g2, snapshot_source)
    kept = _retained(report)
    linear = [_predict(s, o, b, g, g2, kept.get((s, o), 0)) for s, o, b in rows]
    if dims is None:
        return linear, []
    configs = (report.config, _config_of(report, g2, None))
    s = shapes(dims, report.config.tensor_parallel_size)
    return _with_synthetic_captured(linear, (g, g2), configs, s, [])[0], []


def _config_of(report: RunReport, g2: CapturePlan, config_to: RunConfig | None) -> RunConfig:
    """G''s configuration: the overlay's, or the start's with the plan's scheduler limits."""
    if config_to is not None:
        return config_to
    update = {"max_num_seqs": g2.max_num_seqs, "max_num_batched_tokens": g2.max_num_batched_tokens}
    return report.config.model_copy(update={k: v for k, v in update.items() if v})


def _mla_context_to(report: RunReport, terms: FullInitTerms, config: RunConfig) -> int:
    """MLA's prefill-over-context term at G' (memest.estimate.mla_context): its workspace follows
    max_model_len and max_num_seqs."""
    if not terms.mla_context_bytes:
        return 0
    block = report.kv_cache.block_size if report.kv_cache is not None else 16
    return run_mla_context_bytes(config, block)


def _buffer_terms(
    report: RunReport,
    terms: FullInitTerms,
    g2: CapturePlan,
    config_to: RunConfig | None,
    dims: ModelDims | None,
    notes: list[str],
) -> tuple[dict[str, int], dict[str, str]]:
    """The terms grid-sized runner buffers move, at G', and the law that moved each."""
    if dims is None:
        notes.append(
            "model dimensions not recorded in the report nor given (the model's config.json): "
            "the grid-sized runner buffers "
            "(baseline, weights, profiling residue, runner buffers) are kept at G's bytes"
        )
        return {}, _unsized_drafter((report.config, _config_of(report, g2, config_to)), notes)
    block = report.kv_cache.block_size if report.kv_cache is not None else 16
    grid_g = RunnerGrid.from_config(report.config, block_size=block)
    grid_to = RunnerGrid.from_config(_config_of(report, g2, config_to), block_size=block)
    before, after = runner_buffer_bytes(dims, grid_g), runner_buffer_bytes(dims, grid_to)
    if "fused_moe_workspace" not in before and _has_moe_owner(report):
        notes.append(
            "FUSED-MOE WORKSPACE NOT MOVED: the start ran MoE layers (moe_workspace in its "
            "breakdown) but its model dimensions name no experts (a report from before the "
            "plugin recorded them): the workspace, sized by max_num_batched_tokens, is kept at "
            "G's bytes; give the model's config.json with --model-config"
        )
    moved: dict[str, int] = {}
    names: dict[str, list[str]] = {}
    for name in sorted(set(before) | set(after)):
        change = after.get(name, 0) - before.get(name, 0)
        if change:
            term = BUFFER_TERMS[name]
            moved[term] = moved.get(term, 0) + change
            names.setdefault(term, []).append(name)
    laws = {term: "runner buffers f(G') - f(G): " + ", ".join(n) for term, n in names.items()}
    drafter_moves, drafter_laws = _drafter_terms(report, grid_g, grid_to, dims, notes)
    for term, law in drafter_laws.items():
        moved[term] = moved.get(term, 0) + drafter_moves.get(term, 0)
        laws[term] = "; ".join(x for x in (laws.get(term), law) if x)
    values = terms.model_dump()
    out = {term: max(int(values[term]) + change, 0) for term, change in moved.items()}
    return out, laws


def _has_moe_owner(report: RunReport) -> bool:
    bd = report.breakdown
    if bd is None:
        return False
    owners = {p.owner for p in bd.live_peaks} | {t.owner for t in bd.triggers}
    return "moe_workspace" in owners | {r.owner for r in bd.retained}


def _kv_alloc_extra(report: RunReport) -> int:
    """Bytes allocated with the KV cache beyond the KV cache itself (the kv_cache_alloc phase)."""
    from memest.estimate.phases import measured_kv_bytes

    record = phase(report, "kv_cache_alloc")
    if record is None or report.kv_cache is None:
        return 0
    added = record.end.torch_allocated_bytes - record.start.torch_allocated_bytes
    return max(added - measured_kv_bytes(report), 0)


def _drafter_workspaces(report: RunReport) -> dict[str, tuple[int, int]]:
    """Default-pool bytes each capture stage keeps, per phase: {stage: (kept after graph
    profiling, kept after capture)} from the retained rows: the cuBLAS workspace of the stage's
    capture stream (32 MiB on the H200 starts)."""
    out: dict[str, tuple[int, int]] = {}
    rows = [] if report.breakdown is None else report.breakdown.retained
    for r in rows:
        # Reports whose analysis could not name the block call it compiled_piece[:reason].
        kept = r.owner in (CUBLAS_WORKSPACE, COMPILED_PIECE) or r.owner.startswith(
            f"{COMPILED_PIECE}:"
        )
        if not kept or r.phase not in ("graph_profiling", "capture"):
            continue
        prof, cap = out.get(r.stage, (0, 0))
        out[r.stage] = (
            (prof + r.bytes, cap) if r.phase == "graph_profiling" else (prof, cap + r.bytes)
        )
    return out


def _weights_not_moved(method: str, sign: int, notes: list[str]) -> dict[str, str]:
    """The loud note and law when an added or dropped drafter's weights cannot be sized."""
    notes.append(
        f"DRAFTER WEIGHTS NOT MOVED: G' {'adds' if sign > 0 else 'drops'} the {method} drafter, "
        "but this start records no drafter config and none was given, so the weights at G' are "
        f"G's and too {'low' if sign > 0 else 'high'} by the drafter's weights (sized only for "
        "an EAGLE / EAGLE3 drafter from its config.json)"
    )
    return {"weights_bytes": "NOT MOVED: drafter weights unknown (no drafter config)"}


def _unsized_drafter(configs: tuple[RunConfig, RunConfig], notes: list[str]) -> dict[str, str]:
    """Without the model's dimensions: say so when G' adds or drops the drafter."""
    had, has = configs[0].speculative_method, configs[1].speculative_method
    if bool(had) == bool(has):
        return {}
    return _weights_not_moved(str(has or had), 1 if has else -1, notes)


def _drafter_weights(
    method: str, dims: ModelDims | None, sign: int, notes: list[str]
) -> tuple[dict[str, int], dict[str, str]]:
    weights = dims.drafter_weight_bytes(method) if dims is not None else None
    if weights is None:
        return {}, _weights_not_moved(method, sign, notes)
    return {"weights_bytes": sign * weights}, {
        "weights_bytes": "drafter weights (its config's shapes)"
    }


def _drafter_terms(
    report: RunReport,
    grid_g: RunnerGrid,
    grid_to: RunnerGrid,
    dims: ModelDims | None,
    notes: list[str],
) -> tuple[dict[str, int], dict[str, str]]:
    """What adding, dropping or resizing the drafter moves besides its grid-sized buffers.

    - weights (memest.estimate.drafter_weights, from the drafter's config);
    - buffers allocated with the KV cache: the target's once and one copy per speculative token
      (real H200 starts: 4.06 MiB without a drafter, 16.25 MiB at K=3, 24.38 MiB at K=5);
    - the cuBLAS workspace each of the drafter's capture streams keeps (torch allocates one per
      handle and stream inside the first GEMM), once after graph profiling (profiling residue)
      and once after capture (runner buffers): the step-0 PIECEWISE and the later-step FULL
      models keep one each, as large as the target PIECEWISE stage's (32 MiB each on the EAGLE3
      starts); a dropped drafter frees exactly what G's report retained.
    """
    k_g, k_to = grid_g.num_speculative_tokens, grid_to.num_speculative_tokens
    added, dropped = grid_g.speculative_method is None, grid_to.speculative_method is None
    if k_g == k_to and grid_g.speculative_method == grid_to.speculative_method:
        return {}, {}
    moves: dict[str, int] = {}
    laws: dict[str, str] = {}
    per_copy = _kv_alloc_extra(report) / (k_g + 1)
    if k_to != k_g and per_copy:
        moves["runner_buffer_bytes"] = round(per_copy * (k_to - k_g))
        laws["runner_buffer_bytes"] = "drafter: one copy of the KV-allocated buffers per K"
    if added == dropped:  # the drafter is kept (K or method changes)
        return moves, laws
    method = str(grid_to.speculative_method if dropped is False else grid_g.speculative_method)
    sign = 1 if dropped is False else -1
    weights, weight_laws = _drafter_weights(method, dims, sign, notes)
    moves.update(weights)
    laws.update(weight_laws)
    kept = _drafter_workspaces(report)
    if sign > 0:
        prof, cap = kept.get("target.piecewise", (0, 0))
        prof, cap = DRAFTER_COMPILED_MODELS * prof, DRAFTER_COMPILED_MODELS * cap
    else:
        drafts = [v for stage, v in kept.items() if stage.startswith("draft")]
        prof, cap = -sum(p for p, _ in drafts), -sum(c for _, c in drafts)
    for term, change in (("profiling_residue_bytes", prof), ("runner_buffer_bytes", cap)):
        if change:
            moves[term] = moves.get(term, 0) + change
            law = "drafter: cuBLAS workspaces of its capture streams"
            laws[term] = "; ".join(x for x in (laws.get(term), law) if x)
    return moves, laws


def _spec_tokens(config: RunConfig) -> int:
    return config.num_speculative_tokens if config.speculative_method else 0


def _with_unrecorded(
    predictions: list[OwnerPrediction],
    plans: tuple[CapturePlan, CapturePlan],
    configs: tuple[RunConfig, RunConfig],
    s: Shapes,
    notes: list[str],
) -> tuple[list[OwnerPrediction], list[str]]:
    """Pool rows with the stages G's report holds no requests of written by the synthetic trace
    (memest.estimate.whatif_synthetic); returns the rows and those stages."""
    stages = unrecorded_stages(*plans, _spec_tokens(configs[0]), _spec_tokens(configs[1]))
    if not stages:
        return predictions, []
    drafts = any(st.startswith("draft") for st in stages)
    if s.target is None or (drafts and s.drafter is None):
        notes.append(
            f"graph pools of {', '.join(stages)} are not in G's report and not modelled: the "
            "synthetic request trace needs the model's config.json"
            + (" and the drafter's" if drafts else "")
        )
        return predictions, []
    return _replace_stages(predictions, stages, plans, configs, s), stages


def _replace_stages(
    predictions: list[OwnerPrediction],
    stages: list[str],
    plans: tuple[CapturePlan, CapturePlan],
    configs: tuple[RunConfig, RunConfig],
    s: Shapes,
) -> list[OwnerPrediction]:
    """``predictions`` with the rows of ``stages`` replaced by the synthetic trace's."""
    measured = {(p.stage, p.owner): p.measured_bytes for p in predictions if p.stage in stages}
    kept = [p for p in predictions if p.stage not in stages]
    return [*kept, *synthetic_rows(stages, measured, plans, configs, s)]


def _with_synthetic_captured(
    predictions: list[OwnerPrediction],
    plans: tuple[CapturePlan, CapturePlan],
    configs: tuple[RunConfig, RunConfig],
    s: Shapes,
    skip: list[str],
) -> tuple[list[OwnerPrediction], list[str]]:
    """Without a snapshot, the stages both grids capture by the synthetic trace's difference
    (measured at G + synthetic(G') - synthetic(G)) instead of a linear law, where the shapes are
    known: a linear law misses the allocator's segments (the target PIECEWISE pool from 32 to 64
    sequences: +92 MiB)."""
    g, g2 = plans
    captured = {r.runner for r in g.runners if r.sizes}
    stages = [
        r.runner
        for r in g2.runners
        if r.sizes
        and r.runner in captured
        and r.runner not in skip
        and (s.drafter is not None or not r.runner.startswith("draft"))
    ]
    if s.target is None or not stages:
        return predictions, []
    return _replace_stages(predictions, stages, plans, configs, s), stages


def _synthetic_pools(
    predictions: list[OwnerPrediction],
    plans: tuple[CapturePlan, CapturePlan],
    configs: tuple[RunConfig, RunConfig],
    s: Shapes,
    notes: list[str],
    snapshot: Snapshot | None,
) -> tuple[list[OwnerPrediction], list[str]]:
    """Pool rows with what the synthetic trace writes: stages G did not record and, without a
    snapshot, stages both grids capture; returns the rows and the stages it wrote."""
    predictions, synthetic = _with_unrecorded(predictions, plans, configs, s, notes)
    drafter_changed = bool(configs[0].speculative_method) != bool(configs[1].speculative_method)
    if snapshot is not None and not drafter_changed:
        return predictions, synthetic
    if snapshot is not None and s.target is not None:
        notes.append(
            "G' adds or drops the drafter, so the target's graphs gain or lose what the drafter "
            "reads from them (EAGLE3's auxiliary hidden states), which G's snapshot holds no "
            "requests of: the stages both grids capture follow the synthetic request trace"
        )
    predictions, captured = _with_synthetic_captured(predictions, plans, configs, s, synthetic)
    return predictions, [*captured, *synthetic]


def _activation(
    terms: FullInitTerms,
    plans: tuple[CapturePlan, CapturePlan],
    configs: tuple[RunConfig, RunConfig],
    s: Shapes,
    drafter_factor: float | None,
    notes: list[str],
) -> tuple[int, str | None]:
    """The profile pass's activation headroom at G' and the law that moved it.

    The profile pass runs max_num_batched_tokens tokens: its activations are that many rows wide
    (real vLLM, Llama-8B shape: 300 MiB at 2,048 tokens, 592 MiB at 4,096). A drafter added or
    dropped adds or removes its share (memest.estimate.activation with ``drafter_factor``).
    """
    act = terms.profile_peak_activation_bytes
    mbt, mbt2 = plans[0].max_num_batched_tokens, plans[1].max_num_batched_tokens
    had, has = configs[0].speculative_method, configs[1].speculative_method
    laws: list[str] = []
    if had and not has and mbt:
        share = drafter_activation(mbt, s, drafter_factor, had, notes)
        if share is not None:
            act = max(act - share, 0)
            laws.append(f"drafter's share removed ({share} B at G)")
    out = act
    if mbt and mbt2 and mbt != mbt2:
        out = round(act * mbt2 / mbt)
        laws.insert(0, "max_num_batched_tokens")
        notes.append(
            f"activation headroom {act} -> {out} B "
            f"(scales with max_num_batched_tokens {mbt} -> {mbt2})"
        )
    if has and not had and mbt2:
        share = drafter_activation(mbt2, s, drafter_factor, has, notes)
        if share is not None:
            out += share
            laws.append(
                f"drafter: {drafter_factor:.3f} x max_num_batched_tokens x its layer's token bytes"
            )
    return out, "; ".join(laws) or None


def _drafter_kv(spec: KVCacheSpec, s: Shapes, notes: list[str]) -> tuple[int, int]:
    """(KV layers, KV bytes per token) of the drafter: from its shape, else one layer as wide as
    the start's layers (vLLM 0.33.0 gives an EAGLE3 drafter one KV layer of the target's width:
    real H200 starts, Llama-8B: 33 layers and 135,168 B per token with it, 32 and 131,072
    without)."""
    if s.drafter is not None:
        return s.drafter.num_layers, layer_kv_bytes(s.drafter) * s.drafter.num_layers
    per_layer = kv_bytes_per_token(spec) // max(spec.num_layers, 1)
    notes.append(
        "the drafter's KV layer is taken as one layer as wide as the start's (no drafter config)"
    )
    return 1, per_layer


def kv_spec_to(
    report: RunReport, configs: tuple[RunConfig, RunConfig], s: Shapes, notes: list[str]
) -> KVCacheSpec | None:
    """The KV-cache spec at G': the start's, plus an added drafter's KV layers or less a dropped
    drafter's (vLLM allocates the drafter's KV cache in the same blocks)."""
    spec = report.kv_cache
    had, has = configs[0].speculative_method, configs[1].speculative_method
    if spec is None or bool(had) == bool(has):
        return spec
    layers, per_token = _drafter_kv(spec, s, notes)
    sign = 1 if has else -1
    bytes_to = kv_bytes_per_token(spec) + sign * per_token
    if bytes_to <= 0 or spec.num_layers + sign * layers <= 0:
        raise ReportFormatError(
            f"report {report.report_id}: its KV-cache spec holds no target layers once the "
            "drafter's are removed"
        )
    notes.append(
        f"KV bytes per token {kv_bytes_per_token(spec):,} -> {bytes_to:,} "
        f"({'adds' if has else 'drops'} the drafter's {layers} KV layer{'s' if layers > 1 else ''})"
    )
    return spec.model_copy(
        update={
            "num_layers": spec.num_layers + sign * layers,
            "page_size_bytes": bytes_to * spec.block_size,
            "num_blocks": None,
            "kv_tokens": None,
        }
    )


def _check_model_len(
    configs: tuple[RunConfig, RunConfig], dims: ModelDims | None, tokens_to: int | None
) -> None:
    """Refuse a G' max_model_len the model or G''s KV cache cannot serve (vLLM refuses both)."""
    length, before = configs[1].max_model_len, configs[0].max_model_len
    if not length or length == before:
        return
    limit = dims.config.get("max_position_embeddings") if dims and dims.config else None
    if isinstance(limit, int) and length > limit:
        raise ConfigError(
            "grid.max_model_len", length, f"above the model's max_position_embeddings {limit}"
        )
    if tokens_to is not None and tokens_to < length:
        raise ConfigError(
            "grid.max_model_len",
            length,
            f"G' holds {tokens_to:,} KV tokens, less than one request of this length "
            "(vLLM refuses to start)",
        )


def _dominant(changes: Mapping[str, int]) -> str | None:
    """The owner whose bytes move most; None when nothing moves."""
    moving = {o: c for o, c in changes.items() if c}
    return max(moving, key=lambda o: abs(moving[o]), default=None)


def _kv_budget_to(terms_to: FullInitTerms, utilization: float | None) -> int:
    """G's KV budget, refused when G's non-KV memory fills its whole budget."""
    require_fit(
        non_kv_bytes(terms_to),
        terms_to.requested_bytes,
        field="grid.gpu_memory_utilization",
        value=utilization,
    )
    return full_init_kv_budget(terms_to)


def what_if(
    report: RunReport,
    grid: CapturePlan | Mapping[str, Any],
    *,
    margin_bytes: int = 0,
    snapshot: Snapshot | None = None,
    snapshot_source: str = "snapshot",
    dims: ModelDims | None = None,
    drafter_activation_factor: float | None = None,
) -> WhatIf:
    """Predict each owner's pool memory and the KV budget under grid G'.

    Args:
        report: a complete start under grid G (its capture plan, breakdown and phases).
        grid: the capture plan of G' (``memest.plan`` output, or its JSON).
        margin_bytes: safety margin memest keeps free.
        snapshot: the allocator snapshot of the same start; when given, pool rows are predicted
            by allocator replay (memest.estimate.poolreplay) instead of linear laws.
        snapshot_source: name of the snapshot in error messages (its path).
        dims: the model's dimensions (default: those the report records in
            ``config.model_dims`` / ``drafter_dims``); with them the grid-sized runner buffers
            (memest.estimate.runner_buffers) move the baseline, weights, profiling-residue and
            runner-buffer terms by f(G') - f(G), and an added or dropped EAGLE drafter's weights
            are sized; with the model's shape (its config.json), the graph pools of stages G did
            not capture (an added drafter, or a K that changes its later steps) come from the
            synthetic request trace (memest.estimate.whatif_synthetic). Without them those terms
            are kept.
        drafter_activation_factor: the fitted drafter factor of memest.estimate.activation
            (memest.preflight.calibration's, per GPU kind); with it an added or dropped drafter
            moves the activation term by its share. None: the share is not modelled (noted).

    Raises:
        ConfigError: the grid fails validation.
        ReportFormatError: the report lacks its plan, breakdown or phases; the snapshot lacks
            the capture phase or the requests of a stage G' captures.
        SnapshotFormatError: the snapshot is malformed.
    """
    if dims is None:
        dims = ModelDims.from_report(report)  # the dimensions the plugin recorded, if any
    config_to: RunConfig | None = None
    if is_overlay(grid):
        g2, config_to = overlay_grid(report, grid)  # type: ignore[arg-type]
    else:
        g2 = resolve_grid(grid)
    g = measured_plan(report)
    terms = full_init_terms(report, margin_bytes=margin_bytes)
    predictions, notes = pool_predictions(
        report, g2, snapshot=snapshot, snapshot_source=snapshot_source
    )
    s = shapes(dims, report.config.tensor_parallel_size)
    configs = (report.config, _config_of(report, g2, config_to))
    predictions, synthetic = _synthetic_pools(predictions, (g, g2), configs, s, notes, snapshot)
    graph_objects = _graph_object_bytes(report)
    objects = _graph_objects(report, graph_objects, g, g2, dims)

    by_owner: dict[str, int] = {}
    measured_by_owner: dict[str, int] = {}
    for p in [*predictions, objects]:
        by_owner[p.owner] = by_owner.get(p.owner, 0) + p.predicted_bytes
        measured_by_owner[p.owner] = measured_by_owner.get(p.owner, 0) + p.measured_bytes
    pool_from = sum(p.measured_bytes for p in predictions)
    pool_to = sum(p.predicted_bytes for p in predictions)
    by_stage_to: dict[str, int] = {}
    for p in predictions:
        by_stage_to[p.stage] = by_stage_to.get(p.stage, 0) + p.predicted_bytes

    if pool_from != terms.graph_pool_bytes:
        notes.append(
            f"owner rows sum to {pool_from} B, stage rows to {terms.graph_pool_bytes} B; "
            "the KV budget uses the owner rows"
        )
    activation_to, activation_law = _activation(
        terms, (g, g2), configs, s, drafter_activation_factor, notes
    )
    requested_to = terms.requested_bytes
    util_from = report.config.gpu_memory_utilization
    util_to = config_to.gpu_memory_utilization if config_to is not None else util_from
    if util_to is not None and util_to != util_from:
        requested_to = budget_bytes(total_bytes(report), util_to)
        notes.append(
            f"budget {terms.requested_bytes} -> {requested_to} B "
            f"(gpu_memory_utilization {util_from} -> {util_to})"
        )
    buffers_to, buffer_laws = _buffer_terms(report, terms, g2, config_to, dims, notes)
    terms_to = FullInitTerms.model_validate(
        {
            **terms.model_dump(),
            **buffers_to,
            "mla_context_bytes": _mla_context_to(report, terms, configs[1]),
            "requested_bytes": requested_to,
            "profile_peak_activation_bytes": activation_to,
            "graph_pool_bytes": pool_to,
            "graph_pool_by_stage_bytes": by_stage_to,
            "outside_torch_bytes": max(
                terms.outside_torch_bytes - graph_objects + objects.predicted_bytes, 0
            ),
            "source": f"what-if from {terms.source}",
        }
    )
    terms_from = FullInitTerms.model_validate(
        {**terms.model_dump(), "graph_pool_bytes": pool_from, "graph_pool_by_stage_bytes": {}}
    )
    kv_from, kv_to = full_init_kv_budget(terms_from), _kv_budget_to(terms_to, util_to)
    spec, spec_to = report.kv_cache, kv_spec_to(report, configs, s, notes)
    tokens_from = kv_tokens(spec, kv_from) if spec is not None else None
    tokens_to = kv_tokens(spec_to, kv_to) if spec_to is not None else None
    _check_model_len(configs, dims, tokens_to)
    len_from, len_to = configs[0].max_model_len, configs[1].max_model_len
    laws = {
        "graph_pool_bytes": "per-owner pool laws"
        + (" (allocator replay)" if snapshot is not None else "")
        + (f"; synthetic request trace: {', '.join(synthetic)}" if synthetic else ""),
        "outside_torch_bytes": "graph objects (graph profiling and capture) scale with the "
        "graph count x the layers each graph holds",
        **(
            {"mla_context_bytes": "MLA's chunked-prefill workspace (max_model_len, max_num_seqs)"}
            if terms_to.mla_context_bytes != terms.mla_context_bytes
            else {}
        ),
    }
    laws.update(buffer_laws)
    if activation_law is not None:
        laws["profile_peak_activation_bytes"] = activation_law
    if requested_to != terms.requested_bytes:
        laws["requested_bytes"] = "gpu_memory_utilization"
    changes = {o: by_owner[o] - measured_by_owner[o] for o in by_owner}
    dominant = _dominant(changes)
    return WhatIf(
        grid_from=describe_grid(g, len_from),
        grid_to=describe_grid(g2, len_to),
        owners=[*predictions, objects],
        by_owner_bytes=by_owner,
        measured_by_owner_bytes=measured_by_owner,
        graph_pool_bytes_from=pool_from,
        graph_pool_bytes_to=pool_to,
        kv_budget_bytes_from=kv_from,
        kv_budget_bytes_to=kv_to,
        kv_tokens_from=tokens_from,
        kv_tokens_to=tokens_to,
        kv_bytes_per_token_from=kv_bytes_per_token(spec) if spec is not None else None,
        kv_bytes_per_token_to=kv_bytes_per_token(spec_to) if spec_to is not None else None,
        max_model_len_from=len_from or None,
        max_model_len_to=len_to or None,
        concurrency_from=concurrency_at(len_from, tokens_from),
        concurrency_to=concurrency_at(len_to, tokens_to),
        terms_from=terms_from,
        terms_to=terms_to,
        term_laws=laws,
        dominant_owner=dominant,
        dominant_change_bytes=changes[dominant] if dominant is not None else 0,
        notes=notes,
    )


def term_rows(result: WhatIf) -> list[dict[str, Any]]:
    """Each full-initialization term at G and at G', and the law that moved it (or "constant").

    The one list every surface (CLI table, service, run page) shows.
    """
    from memest.estimate.phases import TERM_FIELDS, TERM_LABELS

    if result.terms_from is None or result.terms_to is None:
        return []
    before, after = result.terms_from.model_dump(), result.terms_to.model_dump()
    return [
        {
            "term": term,
            "label": TERM_LABELS[term],
            "bytes_from": int(before[term]),
            "bytes_to": int(after[term]),
            "law": result.term_laws.get(term, "constant"),
        }
        for term in ("requested_bytes", *TERM_FIELDS)
    ]
