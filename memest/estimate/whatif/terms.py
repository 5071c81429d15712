"""The what-if's shared predictions for the term movers (memest.estimate.terms.catalog).

The profile pass's activations follow max_num_batched_tokens (and an added or dropped drafter's
share, with the calibration's factor); the budget follows gpu_memory_utilization; the
grid-sized runner buffers move by f(G') - f(G) (memest.estimate.runner_buffers); an added or
dropped drafter moves its weights, its KV-allocated buffers and its capture streams' cuBLAS
workspaces; MLA's prefill workspace follows max_model_len and max_num_seqs; a TP change moves
what TP adds outside PyTorch (memest.estimate.parallel) and, given the model's dimensions, the
weights per rank (memest.estimate.terms.shape) and nothing else; the graph pools and
graph objects come from the pool predictors (memest.estimate.whatif.pools).
"""

from __future__ import annotations

import dataclasses

from memest.analysis.owners import COMPILED_PIECE, CUBLAS_WORKSPACE
from memest.estimate.model_shape import ModelShape
from memest.estimate.parallel import parallel_bytes, start_layout
from memest.estimate.phases import budget_bytes, phase, total_bytes
from memest.estimate.runner_buffers import (
    BUFFER_TERMS,
    ModelDims,
    RunnerGrid,
    group_tables,
    runner_buffer_bytes,
)
from memest.estimate.terms import catalog, mla_decode
from memest.estimate.terms.shape import parameter_bytes
from memest.estimate.whatif.grid import Grids
from memest.estimate.whatif.models import WhatIfCalibration
from memest.estimate.whatif.pools import Pools
from memest.estimate.whatif_synthetic import Shapes, drafter_activation, shapes
from memest.schema import FullInitTerms, RunConfig, RunReport

#: Compiled drafter models that keep a default-pool workspace (vLLM 0.33.0 EAGLE3: the step-0
#: PIECEWISE model and the later-step FULL model; real H200 starts C and E).
DRAFTER_COMPILED_MODELS = 2


def _buffer_deltas(
    report: RunReport,
    configs: tuple[RunConfig, RunConfig],
    dims: ModelDims | None,
    notes: list[str],
) -> tuple[dict[str, int], dict[str, str]]:
    """What the grid-sized runner buffers and a drafter's moves change per term, f(G') - f(G),
    and the law of each."""
    if dims is None:
        notes.append(
            "model dimensions not recorded in the report nor given (the model's config.json): "
            "the grid-sized runner buffers "
            "(baseline, weights, profiling residue, runner buffers) are kept at G's bytes"
        )
        return {}, _unsized_drafter(configs, notes)
    block = report.kv_cache.block_size if report.kv_cache is not None else 16
    grid_g = _with_groups(RunnerGrid.from_config(configs[0], block_size=block), report)
    grid_to = _with_groups(RunnerGrid.from_config(configs[1], block_size=block), report)
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
    return moved, laws


def _move_decode_logits(
    report: RunReport,
    configs: tuple[RunConfig, RunConfig],
    target: ModelShape,
    dims: ModelDims,
    moves: tuple[dict[str, int], dict[str, str]],
    notes: list[str],
) -> None:
    """TRITON_MLA's split-KV decode logits at G and G' (memest.estimate.terms.mla_decode), in
    the workspace manager's one buffer beside the fused-MoE workspace: the residue holds the
    larger, so it moves by max(G') - max(G) less what the fused-MoE workspace moved already."""
    backend = report.config.mla_decode_backend
    if target.family != "mla" or target.sparse:
        return
    if backend is None:
        notes.append(
            "MLA decode backend not recorded (a report from before the plugin recorded it): "
            "TRITON_MLA's decode logits, sized by max_num_seqs and max_model_len, are not moved"
        )
        return
    block = report.kv_cache.block_size if report.kv_cache is not None else 16
    sides = []
    for config in configs:
        logits = mla_decode.logits_workspace_bytes(
            target,
            backend,
            max_num_seqs=config.max_num_seqs or 1,
            max_model_len=config.max_model_len or 1,
            num_speculative_tokens=config.num_speculative_tokens,
            sms=dims.num_sms,
        )
        grid = RunnerGrid.from_config(config, block_size=block)
        sides.append((logits, runner_buffer_bytes(dims, grid).get("fused_moe_workspace", 0)))
    (logits_g, moe_g), (logits_to, moe_to) = sides
    change = max(logits_to, moe_to) - max(logits_g, moe_g) - (moe_to - moe_g)
    if change:
        deltas, laws = moves
        term = "profiling_residue_bytes"
        deltas[term] = deltas.get(term, 0) + change
        laws[term] = "; ".join(
            x for x in (laws.get(term), f"{backend}'s decode logits (mla_decode)") if x
        )
        notes.append(f"{backend}'s split-KV decode logits {logits_g} -> {logits_to} B")


def _has_moe_owner(report: RunReport) -> bool:
    bd = report.breakdown
    if bd is None:
        return False
    owners = {p.owner for p in bd.live_peaks} | {t.owner for t in bd.triggers}
    return "moe_workspace" in owners | {r.owner for r in bd.retained}


def _kv_alloc_extra(report: RunReport) -> int:
    """Bytes allocated with the KV cache beyond the KV cache itself (the kv_cache_alloc phase)."""
    from memest.estimate.phases import kv_phase_extra_bytes

    record = phase(report, "kv_cache_alloc")
    if record is None or report.kv_cache is None:
        return 0
    return kv_phase_extra_bytes(report, record)


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


def _requested_to(
    report: RunReport, terms: FullInitTerms, configs: tuple[RunConfig, RunConfig], notes: list[str]
) -> int:
    """The budget at G': gpu_memory_utilization x the GPU's total when G' changes it."""
    util_from, util_to = configs[0].gpu_memory_utilization, configs[1].gpu_memory_utilization
    if util_to is None or util_to == util_from:
        return terms.requested_bytes
    requested_to = budget_bytes(total_bytes(report), util_to)
    notes.append(
        f"budget {terms.requested_bytes} -> {requested_to} B "
        f"(gpu_memory_utilization {util_from} -> {util_to})"
    )
    return requested_to


def _weights_per_rank(dims: ModelDims, tp: int) -> int | None:
    """One rank's parameter bytes at TP ``tp`` (memest.estimate.terms.shape, which splits as
    vLLM 0.33.0's linear layers do: column- and row-parallel layers and the vocab-parallel
    embed and lm_head by TP, norms and the rotary cache replicated); the drafter's too when its
    config is known. None where a dimension TP splits is not divisible by ``tp``."""
    s = shapes(dims, tp)
    if s.target is None:
        return None
    total = parameter_bytes(s.target)
    if s.drafter is not None:
        total += parameter_bytes(s.drafter, target_vocab=s.target.vocab)
    return total


def _parallel_moves(
    report: RunReport,
    configs: tuple[RunConfig, RunConfig],
    dims: ModelDims | None,
    notes: list[str],
) -> dict[str, int]:
    """What a TP change moves: TP's buffers outside PyTorch, custom all-reduce's rank_data and,
    with the model's dimensions, the weights per rank (the start's measured weights plus the
    change the shapes give, so what the shapes do not model stays the start's)."""
    tp_from, tp_to = (c.tensor_parallel_size for c in configs)
    if tp_from == tp_to:
        return {}
    layout = start_layout(report.config, report.gpu)
    if dims is not None:  # the model's hidden size sizes FlashInfer's workspace
        layout = dataclasses.replace(layout, hidden_size=dims.hidden_size)
    before = parallel_bytes(layout)
    after = parallel_bytes(dataclasses.replace(layout, tensor_parallel_size=tp_to))
    weights = None
    if dims is not None and dims.config is not None:
        w_from, w_to = _weights_per_rank(dims, tp_from), _weights_per_rank(dims, tp_to)
        weights = None if w_from is None or w_to is None else w_to - w_from
    moved = "what TP adds outside PyTorch" + (" and the weights per rank" if weights else "")
    drafter = (
        "; a drafter without a config keeps the start's weights"
        if weights and configs[1].speculative_method and dims and dims.drafter_config is None
        else ""
    )
    notes.append(
        f"tensor_parallel_size {tp_from} -> {tp_to}: only {moved} {'move' if weights else 'moves'} "
        f"({before.outside_torch_bytes} -> {after.outside_torch_bytes} B outside PyTorch, "
        "memest.estimate.parallel, custom all-reduce on"
        + (f"; weights {weights:+} B from the model's shapes{drafter}" if weights else "")
        + "); the KV bytes per token, activations and graph pools per rank stay the start's: "
        "for those at another TP size use memest preflight or a start at that size"
    )
    out = {
        "outside_torch_bytes": after.outside_torch_bytes - before.outside_torch_bytes,
        "baseline_torch_bytes": after.inside_torch_bytes - before.inside_torch_bytes,
    }
    if weights:
        out["weights_bytes"] = weights
    return out


def _merge(moves: dict[str, int], laws: dict[str, str], more: dict[str, int], law: str) -> None:
    for term, change in more.items():
        if change:
            moves[term] = moves.get(term, 0) + change
            laws[term] = "; ".join(x for x in (laws.get(term), law) if x)


def move_terms(
    report: RunReport,
    terms: FullInitTerms,
    pair: Grids,
    pools: Pools,
    s: Shapes,
    dims: ModelDims | None,
    calibration: WhatIfCalibration,
    notes: list[str],
    *,
    replayed: bool,
) -> tuple[FullInitTerms, FullInitTerms, dict[str, str]]:
    """(terms at G as the KV budget reads them, terms at G', the law of each moved term): each
    term's mover is memest.estimate.terms.catalog's; this module predicts once what several
    movers read (the grid-sized buffers, a drafter's and TP's moves)."""
    if pools.bytes_from != terms.graph_pool_bytes:
        notes.append(
            f"owner rows sum to {pools.bytes_from} B, stage rows to {terms.graph_pool_bytes} B; "
            "the KV budget uses the owner rows"
        )
    deltas, delta_laws = _buffer_deltas(report, pair.configs, dims, notes)
    if dims is not None and s.target is not None:
        _move_decode_logits(report, pair.configs, s.target, dims, (deltas, delta_laws), notes)
    tp_moves = _parallel_moves(report, pair.configs, dims, notes)
    if tp_moves:
        delta_laws["outside_torch_bytes"] = (
            "graph objects x graphs x layers; TP's NCCL and all-reduce buffers "
            "(memest.estimate.parallel)"
        )
        deltas["outside_torch_bytes"] = tp_moves["outside_torch_bytes"]
        law = "custom all-reduce's rank_data (memest.estimate.parallel)"
        _merge(deltas, delta_laws, {"baseline_torch_bytes": tp_moves["baseline_torch_bytes"]}, law)
        law = "parameter shapes x dtype bytes / TP (vLLM's linear-layer sharding)"
        _merge(deltas, delta_laws, {"weights_bytes": tp_moves.get("weights_bytes", 0)}, law)
    factor = calibration.drafter_activation_factor
    block = report.kv_cache.block_size if report.kv_cache is not None else 16
    pool_law = (
        "per-owner pool laws"
        + (" (allocator replay)" if replayed else "")
        + (f"; synthetic request trace: {', '.join(pools.synthetic)}" if pools.synthetic else "")
    )
    move = catalog.Move(
        terms=terms,
        plans=pair.plans,
        configs=pair.configs,
        block_size=block,
        target=s.target,
        drafter_share=lambda tokens, method: drafter_activation(tokens, s, factor, method, notes),
        drafter_factor=factor,
        deltas=deltas,
        delta_laws=delta_laws,
        pools_to=pools.bytes_to,
        pool_law=pool_law,
        objects_change=pools.objects.predicted_bytes - pools.objects.measured_bytes,
        notes=notes,
    )
    values, laws = catalog.moved_terms(move)
    requested_to = _requested_to(report, terms, pair.configs, notes)
    if requested_to != terms.requested_bytes:
        laws["requested_bytes"] = "gpu_memory_utilization"
    terms_to = FullInitTerms.model_validate(
        {
            **terms.model_dump(),
            **values,
            "requested_bytes": requested_to,
            "graph_pool_by_stage_bytes": dict(pools.by_stage_to),
            "source": f"what-if from {terms.source}",
        }
    )
    terms_from = FullInitTerms.model_validate(
        {
            **terms.model_dump(),
            "graph_pool_bytes": pools.bytes_from,
            "graph_pool_by_stage_bytes": {},
        }
    )
    return terms_from, terms_to, laws


def _with_groups(grid: RunnerGrid, report: RunReport) -> RunnerGrid:
    """The grid with one block table per KV-cache group of the start (hybrids have several)."""
    tables = group_tables(report.kv_cache, grid.num_speculative_tokens)
    return dataclasses.replace(grid, tables=tables) if tables else grid
