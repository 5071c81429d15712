"""What a start did not record, written from the model's shape: drafter graph pools and activations.

When G' adds a drafter, or changes its number of speculative tokens K, G' captures graphs whose
requests G's report holds none of (the drafter's stages, or a later-step graph that runs K - 1
draft layers instead of G's). Their pool growth comes from memest.estimate.synthetic_trace, the
same per-graph request program the pre-flight replays:

    predicted = measured at G + synthetic(G') - synthetic(G)     (law ``synthetic_trace``)

per (stage, owner); a stage G did not capture has nothing measured and nothing synthetic at G, so
it is the synthetic replay of G'. Where the synthetic program reproduces G's pools (vLLM 0.33.0,
Llama shapes: to the byte on every H200 start) this is the replay of G'.

The profile pass's activations follow memest.estimate.activation: the target's share is scaled
from what G measured (linear in max_num_batched_tokens); a drafter's share is not in a start
without one, so adding (or dropping) a drafter adds (or removes) the drafter's share of the law
with the fitted drafter factor the caller passes (the pre-flight calibration's, per GPU kind).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memest.errors import ConfigError
from memest.estimate.activation import drafter_activation_bytes
from memest.estimate.indexer import FP32_BYTES, kernel_element_bytes
from memest.estimate.model_shape import ModelShape, model_shape
from memest.estimate.runner_buffers import ModelDims
from memest.estimate.synthetic_trace import IndexerDecode, pool_bytes
from memest.schema import CapturePlan, OwnerPrediction, RunConfig

#: Drafter methods whose graphs the synthetic trace writes as measured (EAGLE3, H200 starts).
MEASURED_DRAFTER_PROGRAM = ("eagle3",)


@dataclass(frozen=True, slots=True)
class Shapes:
    """The target's and the drafter's shapes (None where the dimensions are not known)."""

    target: ModelShape | None
    drafter: ModelShape | None
    indexer_element_bytes: int = FP32_BYTES  # a DSA target's logits kernel: BF16 on SM100


def _shape(cfg: Mapping[str, Any] | None, tp: int, dtype: str | None = None) -> ModelShape | None:
    if cfg is None:
        return None
    named = cfg.get("torch_dtype") or cfg.get("dtype") or dtype or "bfloat16"
    try:
        return model_shape({**cfg, "torch_dtype": str(named).removeprefix("torch.")}, tp=tp)
    except ConfigError:
        return None  # a dimension the shape needs is missing: the caller notes what is not modelled


def shapes(dims: ModelDims | None, tensor_parallel_size: int = 1, *, sm100: bool = False) -> Shapes:
    """Per-rank shapes from the dimensions a what-if has (recorded, or given config.json files);
    ``sm100``: the start's GPU is compute capability 10.x (a DSA target's BF16 logits)."""
    if dims is None:
        return Shapes(None, None)
    target = _shape(dims.config, tensor_parallel_size)
    dtype = dims.config.get("torch_dtype") if dims.config is not None else None
    drafter = _shape(dims.drafter_config, tensor_parallel_size, dtype)
    return Shapes(target, drafter, kernel_element_bytes(sm100))


def _draft_steps(config: RunConfig) -> int:
    return max(config.num_speculative_tokens - 1, 1)


def _synthetic(plan: CapturePlan, config: RunConfig, s: Shapes) -> dict[tuple[str, str], int]:
    assert s.target is not None
    drafter = s.drafter if config.speculative_method else None
    # a DSA target's decode logits at this grid's max_model_len
    mml = config.max_model_len
    indexer = IndexerDecode(mml, s.indexer_element_bytes) if s.target.sparse and mml else None
    replayed = pool_bytes(
        plan,
        s.target,
        drafter,
        draft_steps=_draft_steps(config),
        indexer=indexer,
        method=config.speculative_method,
    )
    return dict(replayed.replay.bytes_by_owner)


def unrecorded_stages(g: CapturePlan, g2: CapturePlan, k_g: int, k_to: int) -> list[str]:
    """Stages of G' whose graphs G's report holds no requests of: stages G did not capture, and
    the drafter's later-step stages when K changes (each graph runs K - 1 draft layers)."""
    captured = {r.runner for r in g.runners if r.sizes}
    out = []
    for row in g2.runners:
        if not row.sizes:
            continue
        if row.runner not in captured or (row.runner.startswith("draft.steps") and k_g != k_to):
            out.append(row.runner)
    return out


def synthetic_rows(
    stages: list[str],
    measured: Mapping[tuple[str, str], int],
    plans: tuple[CapturePlan, CapturePlan],
    configs: tuple[RunConfig, RunConfig],
    s: Shapes,
) -> list[OwnerPrediction]:
    """Owner rows of ``stages``: measured at G + synthetic(G') - synthetic(G) (module docstring).

    Per owner where G's owners carry the synthetic program's names; per stage where they do not
    (a start whose compiled code was mapped names the blocks the program calls compiled_piece):
    the stage's total moves by the program's difference and each owner keeps its share.
    """
    g, g2 = plans
    at_g, at_to = _synthetic(g, configs[0], s), _synthetic(g2, configs[1], s)
    out: list[OwnerPrediction] = []
    for stage in stages:
        owners = {k for k in measured if k[0] == stage and measured[k] > 0}
        program = {k for k in (*at_to, *at_g) if k[0] == stage}
        if owners and not owners <= program:
            out.extend(_stage_rows(stage, measured, at_g, at_to))
            continue
        for key in sorted({k for k in (*measured, *program) if k[0] == stage}):
            was, before, after = measured.get(key, 0), at_g.get(key, 0), at_to.get(key, 0)
            predicted = max(was + after - before, 0)
            note = f"synthetic request trace: {before} B at G, {after} B at G'"
            out.append(_row(key, was, predicted, predicted / was if was else 0.0, note))
    return out


def _row(
    key: tuple[str, str], was: int, predicted: int, factor: float, note: str
) -> OwnerPrediction:
    return OwnerPrediction(
        stage=key[0],
        owner=key[1],
        law="synthetic_trace",
        measured_bytes=was,
        factor=factor,
        predicted_bytes=predicted,
        note=note,
    )


def _stage_rows(
    stage: str,
    measured: Mapping[tuple[str, str], int],
    at_g: Mapping[tuple[str, str], int],
    at_to: Mapping[tuple[str, str], int],
) -> list[OwnerPrediction]:
    """One stage moved as a whole by the synthetic program; owners keep G's shares."""
    rows = sorted((k, b) for k, b in measured.items() if k[0] == stage and b > 0)
    was = sum(b for _, b in rows)
    before = sum(b for k, b in at_g.items() if k[0] == stage)
    after = sum(b for k, b in at_to.items() if k[0] == stage)
    total = max(was + after - before, 0)
    factor = total / was
    note = f"stage total by the synthetic request trace: {before} B at G, {after} B at G'"
    out: list[OwnerPrediction] = []
    left = total
    for i, (key, b) in enumerate(rows):
        share = left if i == len(rows) - 1 else round(b * factor)
        left -= share
        out.append(_row(key, b, share, factor, note))
    return out


def drafter_activation(
    tokens: int, s: Shapes, factor: float | None, method: str, notes: list[str]
) -> int | None:
    """The drafter's share of the profile pass at ``tokens`` tokens; None (noted) when its shape
    or the fitted factor is not known."""
    if s.drafter is None or factor is None:
        missing = "its config.json" if s.drafter is None else "a calibration"
        notes.append(
            f"the {method} drafter's activations in the profile pass are not modelled: the law "
            f"needs {missing}; the activation term holds only the target's"
        )
        return None
    if method not in MEASURED_DRAFTER_PROGRAM:
        notes.append(f"drafter {method}: activations follow EAGLE3's fitted drafter factor")
    return round(drafter_activation_bytes(tokens, s.drafter, factor))
