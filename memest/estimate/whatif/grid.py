"""The what-if's one edge: a grid as a user writes it becomes a typed (plan, config) pair.

A grid G' comes as changes to the start's configuration with vLLM's flag names (an overlay,
memest.plan.overlay), as memest.plan input fields (``sizing`` / ``sm100``) or as a full capture
plan (``runners``). Past this module every step reads :class:`Grids`: G's and G''s capture plans
and configurations, checked once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from memest.errors import ConfigError, ReportFormatError, first_error
from memest.schema import CapturePlan, KVCacheSpec, RunConfig, RunReport
from memest.vllm_versions import VllmVersion, resolve_version


@dataclasses.dataclass(frozen=True)
class Grids:
    """G (the measured start) and G' (the what-if's grid), each a capture plan and a config."""

    plans: tuple[CapturePlan, CapturePlan]
    configs: tuple[RunConfig, RunConfig]
    #: The vLLM release whose rules G' follows (None: the installed, else the newest).
    release: VllmVersion | None = None

    @property
    def drafter_changed(self) -> bool:
        """G' adds or drops the drafter."""
        had, has = (c.speculative_method for c in self.configs)
        return bool(had) != bool(has)


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


def _plan_from_input(grid: Mapping[str, Any], default_sizing: str = "vllm-0.33.0") -> CapturePlan:
    """Resolve ``{"sizing": ..., <memest.plan.PlanInput fields>}`` with memest.plan."""
    from memest.plan import PlanInput, resolve

    fields = dict(grid)
    sizing = fields.pop("sizing", default_sizing)
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


def resolve_grid(
    grid: CapturePlan | Mapping[str, Any], release: VllmVersion | None = None
) -> CapturePlan:
    """A capture plan for G'.

    Args:
        grid: a CapturePlan; its JSON (an object with ``runners``); or memest.plan input fields
            (``sm100``, ``max_num_seqs``, ``max_num_batched_tokens``, ... plus ``sizing``,
            default the sizing ``release`` runs), resolved with ``memest.plan.resolve``.
        release: the vLLM release of G' (None: vLLM 0.33.0's sizing, as before releases).

    Raises:
        ConfigError: naming the first field that fails validation.
    """
    if isinstance(grid, CapturePlan):
        return check_plan(grid)
    if not isinstance(grid, Mapping):
        raise ConfigError("grid", type(grid).__name__, "expected a capture plan (JSON object)")
    if "runners" not in grid:
        return check_plan(_plan_from_input(grid, _sizing(release)))
    try:
        plan = CapturePlan.model_validate(dict(grid))
    except ValidationError as exc:
        where, message, value = first_error(exc)
        raise ConfigError(f"grid.{where or 'grid'}", value, message) from None
    return check_plan(plan)


def is_overlay(grid: object) -> bool:
    """A grid written as changes to the start's configuration (vLLM's flag names).

    A full capture plan has ``runners``; memest.plan input fields come with ``sizing`` or
    ``sm100``; anything else is an overlay (whose unknown fields are errors).
    """
    return isinstance(grid, Mapping) and not {"runners", "sizing", "sm100"} & set(grid)


def _sizing(release: VllmVersion | None) -> str:
    """The capture sizing a release runs (memest.plan.SIZING_BY_VERSION); None: vLLM 0.33.0's."""
    from memest.plan import SIZING_BY_VERSION

    return "vllm-0.33.0" if release is None else SIZING_BY_VERSION[release.version]


def overlay_grid(
    report: RunReport, changes: Mapping[str, Any], release: VllmVersion | None = None
) -> tuple[CapturePlan, RunConfig]:
    """G' as the start's configuration with ``changes``, and its capture plan (the sizing
    ``release`` runs; None: vLLM 0.33.0's).

    Raises:
        ConfigError: an unknown field or a refused value, named.
    """
    from memest.plan.overlay import overlay_plan

    try:
        plan, config = overlay_plan(report.config, changes, report.gpu, _sizing(release))  # type: ignore[arg-type]
    except ConfigError as exc:  # every refusal named as the grid field it came from
        field = exc.field if exc.field.startswith("grid") else f"grid.{exc.field}"
        raise ConfigError(field, exc.value, exc.reason) from None
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


def config_with_limits(report: RunReport, plan: CapturePlan) -> RunConfig:
    """A plan's configuration: the start's, with the plan's scheduler limits."""
    update = {
        "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_num_batched_tokens,
    }
    return report.config.model_copy(update={k: v for k, v in update.items() if v})


def grids(
    report: RunReport, grid: CapturePlan | Mapping[str, Any], release: VllmVersion | None = None
) -> Grids:
    """G from the report and G' from ``grid`` (an overlay, plan input fields or a plan), G'
    under ``release``'s rules (None: vLLM 0.33.0's capture sizing, the start's block size).

    Raises:
        ConfigError: the grid fails validation (the field named as ``grid.<field>``).
        ReportFormatError: the report lists no capture plan.
    """
    if is_overlay(grid):
        plan_to, config_to = overlay_grid(report, grid, release)  # type: ignore[arg-type]
    else:
        plan_to = resolve_grid(grid, release)
        config_to = config_with_limits(report, plan_to)
    return Grids((measured_plan(report), plan_to), (report.config, config_to), release)


def start_release(report: RunReport) -> VllmVersion | None:
    """The release that made the start (build.vllm_version), None when unrecorded or not
    supported (its rules are then unknown, and G's block size is kept)."""
    try:
        return resolve_version(report.build.vllm_version) if report.build.vllm_version else None
    except ConfigError:
        return None


def kv_spec_under(
    report: RunReport, pair: Grids, spec: KVCacheSpec | None, notes: list[str]
) -> KVCacheSpec | None:
    """G''s KV-cache spec with G''s release's block size: a start whose block size was its own
    release's default (no backend or --block-size moved it) gets the default of G''s release
    (vLLM 0.33.0: 16 tokens, 0.34.0: 64); any other block size is kept. Each layer's bytes per
    token are unchanged, so only whole-block rounding moves."""
    before, after = start_release(report), pair.release
    if spec is None or before is None or after is None or spec.groups:
        return spec
    if spec.block_size != before.default_block_size or after.default_block_size == spec.block_size:
        return spec
    block = after.default_block_size
    notes.append(
        f"KV block size {spec.block_size} -> {block} tokens (vLLM {after.version}'s default; the "
        f"start had vLLM {before.version}'s)"
    )
    from memest.estimate.kv import kv_bytes_per_token

    return spec.model_copy(
        update={
            "block_size": block,
            "page_size_bytes": kv_bytes_per_token(spec) * block,
            "num_blocks": None,
            "kv_tokens": None,
        }
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


def describe_grids(pair: Grids) -> tuple[str, str]:
    """G and G' in words (describe_grid), each with its own max_model_len."""
    plan_from, plan_to = pair.plans
    return (
        describe_grid(plan_from, pair.configs[0].max_model_len),
        describe_grid(plan_to, pair.configs[1].max_model_len),
    )
