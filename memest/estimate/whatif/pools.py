"""Pool predictors: each (stage, owner) row of G's graph pools, moved to G'.

Each (stage, owner) pool growth scales with the one quantity of the capture plan that sizes it:

=========================  ======================================================================
owner                      scales with
=========================  ======================================================================
indexer_logits_*           widest FULL rows (requests x q) x positions scored (max_model_len)
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
The indexer's logits are [FULL rows, max_model_len] (memest.estimate.indexer), so a change of
max_model_len (a grid field: ``{"max_model_len": 8192}``) scales them too, in the linear law and in
the replay (each indexer request of G's graphs resized by the max_model_len ratio).
Stages G did not capture (an added drafter's; its later steps when K changes) have no requests
in G's report: given the model's shape they come from the synthetic per-graph trace (law
"synthetic_trace", memest.estimate.whatif_synthetic).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memest.errors import ReportFormatError
from memest.estimate.poolreplay import Graph, PoolRequest, PoolTrace, pool_trace, replay
from memest.estimate.runner_buffers import ModelDims
from memest.estimate.whatif.graph_objects import (
    GRAPH_OBJECTS,
    graph_object_bytes,
    graph_objects,
)
from memest.estimate.whatif.grid import Grids, grids
from memest.estimate.whatif_synthetic import Shapes, shapes, synthetic_rows, unrecorded_stages
from memest.plan.overlay import is_sm100
from memest.schema import CapturePlan, OwnerPrediction, RunConfig, RunnerRow, RunReport
from memest.schema.estimate import ScalingLaw
from memest.snapshot.format import Snapshot

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


INDEXER_OWNERS = "indexer_logits"


def positions_ratio(configs: tuple[RunConfig, RunConfig]) -> float:
    """max_model_len at G' over G: what scales the indexer's positions scored (1 when either
    is unknown)."""
    before, after = (c.max_model_len for c in configs)
    return after / before if before and after else 1.0


def with_positions(trace: PoolTrace, ratio: float) -> PoolTrace:
    """``trace`` with every indexer-logits request resized by ``ratio`` (max_model_len)."""
    if ratio == 1.0:
        return trace
    stages: dict[str, list[Graph]] = {}
    for stage, graphs in trace.stages.items():
        stages[stage] = [
            Graph(
                g.stage,
                g.size,
                [
                    PoolRequest(
                        op.handle, max(round(op.size * ratio), 1), op.stream, op.owner, op.index
                    )
                    if isinstance(op, PoolRequest) and op.owner.startswith(INDEXER_OWNERS)
                    else op
                    for op in g.ops
                ],
            )
            for g in graphs
        ]
    return PoolTrace(trace.source, stages, trace.measured, trace.measured_segments)


def _quantity(row: RunnerRow, law: ScalingLaw) -> int:
    if law == "sum_piecewise_tokens":
        return row.sum_tokens
    if law in ("graph_count", "graph_count_x_layers"):
        return row.graph_count
    return row.widest_tokens


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
    charged: dict[str, int] = {}  # per stage, so that the remainder is one look-up per stage
    for t in bd.triggers:
        if t.phase != "capture":
            continue
        rows[(t.stage, t.owner)] = rows.get((t.stage, t.owner), 0) + t.bytes
        charged[t.stage] = charged.get(t.stage, 0) + t.bytes
    for s in bd.stages:
        if s.phase != "capture":
            continue
        rest = s.pool_growth_bytes - charged.get(s.stage, 0)
        if rest > 0:
            rows[(s.stage, f"unattributed:{s.stage}")] = rest
    return [(stage, owner, b) for (stage, owner), b in rows.items()]


def _runner_row(plan: CapturePlan, stage: str) -> RunnerRow | None:
    """The runner of ``plan`` named ``stage`` (a plan has a handful of runners)."""
    return next((r for r in plan.runners if r.runner == stage), None)


def _predict(
    stage: str,
    owner: str,
    measured: int,
    g: CapturePlan,
    g2: CapturePlan,
    retained: int = 0,
    positions: float = 1.0,
) -> OwnerPrediction:
    """One row by its linear law; ``positions``: max_model_len at G' over G (indexer rows)."""
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
        row_g, row_g2 = _runner_row(g, stage), _runner_row(g2, stage)
        if row_g is None:
            return made(1.0, measured, f"stage {stage} is not a runner of grid G: kept")
        if row_g2 is None:
            return made(0.0, 0, f"grid G' captures no {stage} graphs")
        before, after = _quantity(row_g, law), _quantity(row_g2, law)
    if before == 0:
        return made(1.0, measured, "the law's quantity is 0 under G: kept")
    factor = after / before
    base, note = measured, ""
    if law == "widest_full_rows_x_context" and positions != 1.0:
        factor *= positions
        note = f"rows x{after / before:.3f}, max_model_len x{positions:.3f}"
    if law == "sum_piecewise_tokens" and retained > measured:
        # Under G part of the retained outputs landed in space freed by transient buffers; that
        # slack is bounded by the widest transient, not by the sum, so scale what stays live.
        base = retained
        note = f"scaled from {retained} B retained, not {measured} B of pool growth"
    return made(factor, round(base * factor), note)


def _stage_ratio(stage: str, g: CapturePlan, g2: CapturePlan) -> float:
    """Widest size of a stage under G' over G (the widest replayed graph's scale)."""
    row_g, row_g2 = _runner_row(g, stage), _runner_row(g2, stage)
    if row_g is None or not row_g.sizes:
        return 1.0
    return max(row_g2.sizes) / max(row_g.sizes) if row_g2 is not None and row_g2.sizes else 0.0


def _replayed(
    rows: list[tuple[str, str, int]],
    snapshot: Snapshot,
    g: CapturePlan,
    g2: CapturePlan,
    source: str,
    positions: float = 1.0,
) -> tuple[list[OwnerPrediction], list[str]]:
    """Pool rows by allocator replay of the G snapshot (indexer requests resized by
    ``positions``, max_model_len at G' over G).

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
    to, again = replay(with_positions(trace, positions), g2), replay(trace, g)
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
            out.append(_predict(stage, owner, measured, g, g2, 0, positions))
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


def measured_pools(
    report: RunReport, pair: Grids, snapshot: Snapshot | None, snapshot_source: str
) -> tuple[list[OwnerPrediction], list[str]]:
    """G's pool rows moved to G' by allocator replay (with a snapshot) or the linear laws."""
    g, g2 = pair.plans
    rows = _owner_rows(report)
    ratio = positions_ratio(pair.configs)
    if snapshot is not None:
        return _replayed(rows, snapshot, g, g2, snapshot_source, ratio)
    kept = _retained(report)
    return [_predict(s, o, b, g, g2, kept.get((s, o), 0), ratio) for s, o, b in rows], []


def pool_predictions(
    report: RunReport,
    grid: CapturePlan | Mapping[str, Any],
    *,
    snapshot: Snapshot | None = None,
    snapshot_source: str = "snapshot",
    dims: ModelDims | None = None,
) -> tuple[list[OwnerPrediction], list[str]]:
    """The graph-pool rows of the what-if and their notes, without the KV budget.

    Needs the report's capture plan and breakdown only, not the phases the KV budget reads.
    Without a snapshot but with the model's dimensions, the stages both grids capture move by
    the synthetic request trace's difference, as in the what-if.

    Raises:
        ConfigError: the grid fails validation.
        ReportFormatError: see :func:`memest.estimate.whatif.what_if`.
    """
    pair = grids(report, grid)
    predictions, notes = measured_pools(report, pair, snapshot, snapshot_source)
    if snapshot is not None or dims is None:
        return predictions, notes
    s = shapes(dims, report.config.tensor_parallel_size, sm100=is_sm100(report.gpu))
    return _with_synthetic_captured(predictions, pair.plans, pair.configs, s, [])[0], []


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
    replaced = set(stages)
    measured = {(p.stage, p.owner): p.measured_bytes for p in predictions if p.stage in replaced}
    kept = [p for p in predictions if p.stage not in replaced]
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


def synthetic_pools(
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


@dataclass(frozen=True)
class Pools:
    """Every pool row of G', the graph objects beside them, what wrote them, and their totals.

    The totals are plain fields filled once by ``predict_pools``, so the term movers and the
    result read values rather than calling back into this module.
    """

    rows: list[OwnerPrediction]  #: graph-pool rows (stage, owner)
    objects: OwnerPrediction  #: graph objects outside PyTorch
    synthetic: list[str]  #: stages the synthetic request trace wrote
    bytes_from: int  #: G's pool rows, as measured
    bytes_to: int  #: G''s pool rows, as predicted
    by_stage_to: dict[str, int]  #: G''s predicted pool bytes per capture stage


def _pools(rows: list[OwnerPrediction], objects: OwnerPrediction, synthetic: list[str]) -> Pools:
    by_stage: dict[str, int] = {}
    for p in rows:
        by_stage[p.stage] = by_stage.get(p.stage, 0) + p.predicted_bytes
    return Pools(
        rows,
        objects,
        synthetic,
        bytes_from=sum(p.measured_bytes for p in rows),
        bytes_to=sum(p.predicted_bytes for p in rows),
        by_stage_to=by_stage,
    )


def predict_pools(
    report: RunReport,
    pair: Grids,
    dims: ModelDims | None,
    snapshot: Snapshot | None,
    snapshot_source: str,
) -> tuple[Pools, list[str]]:
    """G''s pool rows (replay or laws, then the synthetic trace) and graph objects, with notes."""
    rows, notes = measured_pools(report, pair, snapshot, snapshot_source)
    s = shapes(dims, report.config.tensor_parallel_size, sm100=is_sm100(report.gpu))
    rows, synthetic = synthetic_pools(rows, pair.plans, pair.configs, s, notes, snapshot)
    objects = graph_objects(report, graph_object_bytes(report), *pair.plans, dims)
    return _pools(rows, objects, synthetic), notes
