"""The KV budget at G' and the what-if's answer (memest.estimate.whatif.what_if).

The grid enters once as a typed (plan, config) pair (grid.py), the pool predictors move G's
graph pools (pools.py, graph_objects.py), the term movers every other term (terms.py); here the
terms at G' become the KV budget, KV tokens and requests at max_model_len, and the WhatIf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError, ReportFormatError
from memest.estimate.growable import predict_growable
from memest.estimate.inverse import concurrency_at
from memest.estimate.kv import (
    config_kv_tokens,
    kv_bytes_per_token,
    kv_cache_dtype_bytes,
    layer_kv_bytes,
    require_fit,
    rescale_kv_dtype,
)
from memest.estimate.model_shape import DTYPE_BYTES
from memest.estimate.phases import full_init_kv_budget, non_kv_bytes
from memest.estimate.runner_buffers import ModelDims
from memest.estimate.terms.catalog import full_init_terms
from memest.estimate.whatif.grid import Grids, describe_grids, grids, kv_spec_under
from memest.estimate.whatif.models import TermRow, WhatIfCalibration
from memest.estimate.whatif.pools import Pools, predict_pools
from memest.estimate.whatif.terms import move_terms
from memest.estimate.whatif_synthetic import Shapes, shapes
from memest.plan.overlay import is_sm100
from memest.schema import CapturePlan, FullInitTerms, KVCacheSpec, RunConfig, RunReport, WhatIf
from memest.schema.estimate import GrowableKvPrediction
from memest.snapshot.format import Snapshot
from memest.vllm_versions import VllmVersion


def _drafter_kv(spec: KVCacheSpec, s: Shapes, notes: list[str]) -> tuple[int, int]:
    """(KV layers, KV bytes per token) of the drafter: from its shape, else one layer as wide as
    the start's layers (vLLM 0.33.0 gives an EAGLE3 drafter one KV layer of the target's width:
    real H200 starts, Llama-8B: 33 layers and 135,168 B per token with it, 32 and 131,072
    without)."""
    if s.drafter is not None:
        per_element = layer_kv_bytes(s.drafter) // s.drafter.dtype_bytes  # in the spec's dtype
        return s.drafter.num_layers, per_element * spec.dtype_bytes * s.drafter.num_layers
    per_layer = kv_bytes_per_token(spec) // max(spec.num_layers, 1)
    notes.append(
        "the drafter's KV layer is taken as one layer as wide as the start's (no drafter config)"
    )
    return 1, per_layer


def _model_dtype_bytes(report: RunReport, spec: KVCacheSpec) -> int:
    """Bytes per element of the model's dtype: its recorded dims, else the start's KV dtype when
    that was "auto" (the model's)."""
    dims = report.config.model_dims
    if dims is not None and dims.dtype.lower() in DTYPE_BYTES:
        return DTYPE_BYTES[dims.dtype.lower()]
    if report.config.kv_cache_dtype in (None, "auto"):
        return spec.dtype_bytes
    raise ReportFormatError(
        f"report {report.report_id}: the model's dtype is not recorded, so kv_cache_dtype "
        "auto cannot be sized"
    )


def kv_dtype_to(
    report: RunReport, configs: tuple[RunConfig, RunConfig], notes: list[str]
) -> KVCacheSpec | None:
    """The start's KV-cache spec in G''s --kv-cache-dtype (memest.estimate.kv)."""
    spec = report.kv_cache
    dtype = configs[1].kv_cache_dtype
    if spec is None or dtype is None or dtype == configs[0].kv_cache_dtype:
        return spec
    size = kv_cache_dtype_bytes(
        dtype, _model_dtype_bytes(report, spec), field="grid.kv_cache_dtype"
    )
    if size == spec.dtype_bytes:
        return spec
    out = rescale_kv_dtype(spec, size, dtype)
    notes.append(
        f"KV bytes per token {kv_bytes_per_token(spec):,} -> {kv_bytes_per_token(out):,} "
        f"(kv_cache_dtype {dtype}: {size} B per element)"
    )
    return out


def kv_spec_to(
    report: RunReport, configs: tuple[RunConfig, RunConfig], s: Shapes, notes: list[str]
) -> KVCacheSpec | None:
    """The KV-cache spec at G': the start's in G''s KV dtype, plus an added drafter's KV layers
    or less a dropped drafter's (vLLM allocates the drafter's KV cache in the same blocks)."""
    spec = kv_dtype_to(report, configs, notes)
    had, has = configs[0].speculative_method, configs[1].speculative_method
    if spec is None or bool(had) == bool(has):
        return spec
    if spec.groups:
        raise ConfigError(
            "grid.speculative_config",
            has or had,
            "a hybrid's drafter KV layers are not grouped by memest",
        )
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
    if not isinstance(limit, int) and before and length > before:
        # Past the start's own length the model's positions decide, and nothing says them.
        raise ConfigError(
            "grid.max_model_len",
            length,
            f"above this start's {before:,} and the model's max_position_embeddings is not "
            "known (the report records none): give the model's config.json",
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
    calibration: WhatIfCalibration | None = None,
    release: VllmVersion | None = None,
) -> WhatIf:
    """Predict each owner's pool memory and the KV budget under grid G'.

    Args:
        report: a complete start under grid G (its capture plan, breakdown and phases).
        grid: G' as changes to the start's configuration (vLLM's flag names), memest.plan input
            fields, or a capture plan (``memest.plan`` output, or its JSON).
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
        calibration: the fitted factors of the start's GPU kind (memest.preflight's, handed in);
            with the drafter factor an added or dropped drafter moves the activation term by its
            share. None: what only the fit knows is not modelled (noted).
        release: the vLLM release G' runs (memest.vllm_versions): its capture sizing, KV block
            size and, on 0.34, its growable KV cache's sizing beside memest's. None: vLLM
            0.33.0's capture sizing and the start's block size, no release named.

    Raises:
        ConfigError: the grid fails validation.
        ReportFormatError: the report lacks its plan, breakdown or phases; the snapshot lacks
            the capture phase or the requests of a stage G' captures.
        SnapshotFormatError: the snapshot is malformed.
    """
    if dims is None:
        dims = ModelDims.from_report(report)  # the dimensions the plugin recorded, if any
    pair = grids(report, grid, release)
    s = shapes(dims, report.config.tensor_parallel_size, sm100=is_sm100(report.gpu))
    terms = full_init_terms(report, margin_bytes=margin_bytes, shape=s.target)
    pools, notes = predict_pools(report, pair, dims, snapshot, snapshot_source)
    terms_from, terms_to, laws = move_terms(
        report,
        terms,
        pair,
        pools,
        s,
        dims,
        calibration or WhatIfCalibration(),
        notes,
        replayed=snapshot is not None,
    )
    kv_from = full_init_kv_budget(terms_from)
    kv_to = _kv_budget_to(terms_to, pair.configs[1].gpu_memory_utilization)
    spec_to = kv_spec_under(report, pair, kv_spec_to(report, pair.configs, s, notes), notes)
    out = _result(
        report, pair, pools, (terms_from, terms_to), laws, (kv_from, kv_to), spec_to, dims, notes
    )
    if release is None:
        return out
    return out.model_copy(
        update={
            "vllm_version_to": release.version,
            "growable_kv_to": _growable_to(report, pair, terms_to, spec_to, release, grid),
        }
    )


def _growable_to(
    report: RunReport,
    pair: Grids,
    terms_to: FullInitTerms,
    spec_to: KVCacheSpec | None,
    release: VllmVersion,
    grid: CapturePlan | Mapping[str, Any],
) -> GrowableKvPrediction | None:
    """0.34's growable sizing at G' (memest.estimate.growable, the pre-flight's): None on a
    release without it, or without the GPU's total memory or a KV-cache spec. Its utilization
    is G''s when the grid sets it, else unset (1.0 with the growable cache)."""
    total = report.gpu.total_bytes if report.gpu is not None else None
    if release.extensible_kv is None or spec_to is None or not total:
        return None
    given = isinstance(grid, Mapping) and "gpu_memory_utilization" in grid
    c = pair.configs[1]
    return predict_growable(
        release,
        terms_to,
        spec_to,
        total_bytes=total,
        gpu_memory_utilization=c.gpu_memory_utilization if given else None,
        margin_bytes=terms_to.margin_bytes,
        lengths=(c.max_model_len, c.max_num_batched_tokens),
    )


def _result(
    report: RunReport,
    pair: Grids,
    pools: Pools,
    terms: tuple[FullInitTerms, FullInitTerms],
    laws: dict[str, str],
    budgets: tuple[int, int],
    spec_to: KVCacheSpec | None,
    dims: ModelDims | None,
    notes: list[str],
) -> WhatIf:
    """The WhatIf: pool rows by owner, the KV budget, tokens and requests at G and G'."""
    spec = report.kv_cache
    # a hybrid's sliding and state groups move with G''s lengths (memest.estimate.kv_groups)
    tokens_from = config_kv_tokens(spec, budgets[0], pair.configs[0]) if spec else None
    tokens_to = config_kv_tokens(spec_to, budgets[1], pair.configs[1]) if spec_to else None
    _check_model_len(pair.configs, dims, tokens_to)
    len_from, len_to = pair.configs[0].max_model_len, pair.configs[1].max_model_len
    owners = [*pools.rows, pools.objects]
    by_owner: dict[str, int] = {}
    measured_by_owner: dict[str, int] = {}
    for p in owners:
        by_owner[p.owner] = by_owner.get(p.owner, 0) + p.predicted_bytes
        measured_by_owner[p.owner] = measured_by_owner.get(p.owner, 0) + p.measured_bytes
    changes = {o: by_owner[o] - measured_by_owner[o] for o in by_owner}
    dominant = _dominant(changes)
    grid_from, grid_to = describe_grids(pair)
    return WhatIf(
        grid_from=grid_from,
        grid_to=grid_to,
        owners=owners,
        by_owner_bytes=by_owner,
        measured_by_owner_bytes=measured_by_owner,
        graph_pool_bytes_from=pools.bytes_from,
        graph_pool_bytes_to=pools.bytes_to,
        kv_budget_bytes_from=budgets[0],
        kv_budget_bytes_to=budgets[1],
        kv_tokens_from=tokens_from,
        kv_tokens_to=tokens_to,
        kv_bytes_per_token_from=kv_bytes_per_token(spec) if spec is not None else None,
        kv_bytes_per_token_to=kv_bytes_per_token(spec_to) if spec_to is not None else None,
        max_model_len_from=len_from or None,
        max_model_len_to=len_to or None,
        concurrency_from=concurrency_at(len_from, tokens_from),
        concurrency_to=concurrency_at(len_to, tokens_to),
        terms_from=terms[0],
        terms_to=terms[1],
        term_laws=laws,
        dominant_owner=dominant,
        dominant_change_bytes=changes[dominant] if dominant is not None else 0,
        notes=notes,
    )


def term_rows(result: WhatIf) -> list[TermRow]:
    """Each full-initialization term at G and at G', and the law that moved it (or "constant").

    The one list every surface (CLI table, service, run page) shows.
    """
    from memest.estimate.phases import TERM_FIELDS, TERM_LABELS

    if result.terms_from is None or result.terms_to is None:
        return []
    before, after = result.terms_from.model_dump(), result.terms_to.model_dump()
    return [
        TermRow(
            term=term,
            label=TERM_LABELS[term],
            bytes_from=int(before[term]),
            bytes_to=int(after[term]),
            law=result.term_laws.get(term, "constant"),
        )
        for term in ("requested_bytes", *TERM_FIELDS)
    ]
