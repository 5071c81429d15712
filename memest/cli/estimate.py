"""KV budget of one start: vLLM's estimate, memest's full-initialization one, the end state.

memest estimate --from REPORT.json [--grid JSON [--snapshot PATH] [--model-config JSON
                [--drafter-config JSON]]] [--kv-tokens N |
                --concurrency C] [--margin SIZE] [--vllm-version X.Y.Z] [--json]
                [--write-startup-plan DIR [--create-dir]]

REPORT.json is a RunReport (schema version 1) with the phases weights, profile_run,
kv_cache_alloc and capture or end, and its KV-cache spec. --grid predicts each owner's graph-pool
memory, every full-initialization term and the KV budget under another grid G', written as only
what changes, with vLLM's flag names, overlaid on the report's own configuration:
{"max_num_seqs": 512}, {"max_num_batched_tokens": 8192}, {"gpu_memory_utilization": 0.9},
{"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3}} (null drops the
drafter), {"compilation_config": {"max_cudagraph_capture_size": 256}} (capture sizes or the
five fields); max_model_len, speculative_method and num_speculative_tokens too;
tensor_parallel_size moves what TP adds outside PyTorch (NCCL, all-reduce buffers) and, with
the model's dimensions, the weights per rank from its shapes. An unknown
field is an error naming it. A full capture plan ({"runners": ...}) or memest.plan input
fields ({"sizing": "vllm-0.33.0", "sm100": false, ...}) are accepted as before.
The model's dimensions (recorded in the report by the plugin as config.model_dims and
config.drafter_dims, or given with --model-config, the model's Hugging Face config.json, and
--drafter-config, the drafter's, which override the recorded ones) move the grid-sized buffers
vLLM allocates at load (penalties, structured-output masks, the sampler's top-k/top-p buffer,
input and drafter buffers, block tables, an MoE model's fused-MoE workspace) in the baseline,
weights, profiling-residue and runner-buffer terms by f(G') - f(G), and size an EAGLE / EAGLE3
drafter's weights when G' adds or drops it; without them those terms are kept at G's bytes. With the model's shape (a
config.json) the graph pools of stages G did not capture (an added drafter's, or its later-step
graphs when K changes) come from the synthetic per-graph request trace the pre-flight replays,
and an added or dropped drafter's share of the profile pass's activations from the activation
law with the drafter factor of the GPU kind's pre-flight calibration.
Without --snapshot, the stages both grids capture move by the synthetic trace's difference too
(measured at G + synthetic(G') - synthetic(G)) where the model's shape is known. Adding or
dropping a drafter adds or drops its KV layer(s) in the KV bytes per token (from the drafter's
config.json, else one layer as wide as the start's); without the drafter's config.json its
weights are not moved, and the output says so. G and G' are described with max_model_len; the
requests of max_model_len that the KV tokens hold are printed at G and at G' (a max_model_len the
model or G''s KV cache cannot hold is refused).
--snapshot names the allocator snapshot of the same start: the what-if then replays its graph-pool
requests, resized for G', through a model of the caching allocator (pool growth is made of
segments, which linear laws miss by up to a segment per trigger).
--kv-tokens N (or --concurrency C, N = C x max_model_len) answers the inverse questions under
G' (or, without --grid, the start's own grid, with no what-if printed): the
gpu_memory_utilization that holds N tokens, and the largest max_num_seqs, never above G''s
max_num_batched_tokens, that still holds them at G's utilization.
--vllm-version names the vLLM release G' runs (0.33.0 or 0.34.0; default: the installed one,
else the newest supported), whose rules the what-if takes from memest.vllm_versions: its capture
sizing (memest.plan.SIZING_BY_VERSION: 0.34.0 runs the five capture fields), its KV block size (a
start at its own release's default block size gets the new release's: 16 tokens on 0.33.0, 64 on
0.34.0) and, on 0.34.0, its growable KV cache's sizing at G' beside memest's (as the pre-flight
predicts it). On a start measured on another release, the terms are the start's, moved to G'.
--write-startup-plan writes the startup-plan file (VLLM_ENABLE_STARTUP_PLAN=1) of the vLLM
release that made the report (build.vllm_version: schema 1 for 0.33.0, 2 for 0.34.0) into
DIR, which should be {VLLM_CACHE_ROOT}/startup_plan; the report must carry the worker's plan
fingerprint and free-memory baseline (estimate.startup_plan). A plan file of that name already
in DIR (the plugin's, say) is never replaced: the command stops with an error naming it. DIR
must exist unless --create-dir
is given (an unset $VLLM_CACHE_ROOT would otherwise write /startup_plan). A plan for G' cannot
be written (its fingerprint is computed by vLLM's worker). The matching vLLM flag is printed
either way: --kv-cache-memory-bytes=N, memest's recommendation for G (the startup plan the
plugin wrote after the start, when the report carries it, else memest's budget in the start)
and, after a what-if, memest's budget for G'.
--json prints {"accounting": the start's figures as every memest surface shows them,
"comparison": the estimators and terms, "kv_cache_memory_bytes", "startup_plan_path"}, plus
"what_if" and "kv_cache_memory_bytes_to" with --grid and "inverse" with --kv-tokens or
--concurrency.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memest.cli._reports import load_report
from memest.errors import CommandError, ConfigError, DoesNotFitError
from memest.estimate import account, compare, startup_plan_document, write_startup_plan
from memest.estimate.runner_buffers import ModelDims
from memest.estimate.whatif import TermRow, WhatIfAnswer, WhatIfQuestion, answer
from memest.files import load_json_file, load_json_object
from memest.preflight.calibration import what_if_calibration
from memest.reporters.estimate import render_accounting, render_what_if
from memest.reporters.growable import growable_table
from memest.reporters.kv_groups import kv_groups_table
from memest.reporters.recommend import kv_cache_flag, recommended_kv_cache_bytes
from memest.reporters.table import text_lines
from memest.schema import EstimateComparison, RunReport, WhatIf
from memest.snapshot import load_snapshot
from memest.units import gib_cell, kv_cache_memory_flag, parse_bytes


def load_grid(text: str) -> dict[str, Any]:
    """The --grid value: inline JSON (starting with '{') or a path to a JSON file."""
    return load_json_object("--grid", text, error=CommandError)


def _check_plan_dir(directory: Path | None, *, create: bool) -> None:
    """Refuse a plan folder that does not exist unless asked to create it."""
    if directory is None:
        if create:
            raise ConfigError("--create-dir", True, "only used with --write-startup-plan")
        return
    if directory.is_dir() or create:
        return
    what = "is not a folder" if directory.exists() else "does not exist"
    raise CommandError(
        f"--write-startup-plan {directory}: {what} (is $VLLM_CACHE_ROOT set? "
        "pass --create-dir to create it)"
    )


class EstimateCommand:
    name = "estimate"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--from", dest="report", type=Path, required=True, help="RunReport JSON"
        )
        parser.add_argument("--grid", help="grid G' for a what-if (JSON file or inline JSON)")
        parser.add_argument(
            "--snapshot",
            type=Path,
            help="allocator snapshot of the same start: what-if by allocator replay (with --grid)",
        )
        parser.add_argument(
            "--model-config",
            type=Path,
            metavar="JSON",
            help="the model's Hugging Face config.json (overrides the report's model_dims): "
            "grid-sized runner buffers move with G'; its shape writes the graph pools of stages "
            "G did not capture",
        )
        parser.add_argument(
            "--drafter-config",
            type=Path,
            metavar="JSON",
            help="the drafter's config.json (overrides the report's drafter_dims): its weights, "
            "graph pools and activations when G' adds the drafter or changes K",
        )
        parser.add_argument(
            "--kv-tokens",
            type=int,
            metavar="N",
            help="inverse question: the gpu_memory_utilization that holds N KV tokens under the "
            "grid (G' with --grid), and the largest max_num_seqs that still holds them",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            metavar="C",
            help="like --kv-tokens with N = C x max_model_len (C requests at full length)",
        )
        parser.add_argument("--margin", default="0", help="memory kept free, e.g. 64MiB")
        parser.add_argument(
            "--vllm-version",
            metavar="X.Y.Z",
            help="the vLLM release G' runs (0.33.0 or 0.34.0; default: the installed one, else "
            "the newest supported): its capture sizing, KV block size and 0.34's growable KV "
            "sizing",
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument(
            "--write-startup-plan",
            type=Path,
            metavar="DIR",
            help="write vLLM's startup_plan_<fingerprint>.json into DIR (an existing folder)",
        )
        parser.add_argument(
            "--create-dir",
            action="store_true",
            help="with --write-startup-plan: create DIR when it does not exist",
        )

    def run(self, args: argparse.Namespace) -> int:
        _check_plan_dir(args.write_startup_plan, create=args.create_dir)
        report = load_report(args.report)
        margin = parse_bytes(args.margin, field="--margin")
        if margin < 0:
            raise ConfigError("--margin", args.margin, "must not be negative")
        if args.snapshot is not None and not args.grid:
            raise ConfigError("--snapshot", str(args.snapshot), "only used with --grid")
        if args.model_config is not None and not args.grid and args.kv_tokens is None:
            if args.concurrency is None:
                raise ConfigError("--model-config", str(args.model_config), "only used with --grid")
        comparison = compare(report, margin_bytes=margin)
        accounting = account(report, margin_bytes=margin)
        result = _cli_errors(_answer, args, report, margin)
        shown = result if args.grid is not None else None  # the inverse alone shows no what-if
        kv_bytes = recommended_kv_cache_bytes(accounting)
        plan_path = _write_plan(args, comparison, kv_bytes, report.build.vllm_version)
        out = {
            "accounting": accounting,
            "comparison": comparison,
            "what_if": shown.what_if if shown is not None else None,
            "terms": shown.terms if shown is not None else [],
            "kv_cache_memory_bytes": kv_bytes,
            "inverse": result.inverse if result is not None else None,
            "startup_plan_path": plan_path,
        }
        sys.stdout.write(_as_json(out) if args.json else _as_text(out))
        return 0


def _answer(args: argparse.Namespace, report: RunReport, margin: int) -> WhatIfAnswer | None:
    """The what-if of --grid and the inverse answers of --kv-tokens / --concurrency (without
    --grid, asked of the start's own grid, with no what-if shown); None when neither is asked."""
    if args.grid is None and args.kv_tokens is None and args.concurrency is None:
        return None
    question = WhatIfQuestion(
        grid=load_grid(args.grid or "{}"),
        margin_bytes=margin,
        kv_tokens=args.kv_tokens,
        concurrency=args.concurrency,
        vllm_version=args.vllm_version,
    )
    snapshot = load_snapshot(args.snapshot) if args.snapshot is not None else None
    return answer(
        report,
        question,
        calibration=what_if_calibration(report),
        dims=_dims(args, report),
        snapshot=snapshot,
        snapshot_source=str(args.snapshot),
    )


def _flag(field: str) -> str:
    """A core field name as the CLI spells it: kv_tokens -> --kv-tokens, grid.x -> --grid x."""
    if field.startswith("grid."):
        return f"--grid {field.removeprefix('grid.')}"
    if field in ("kv_tokens", "concurrency", "gpu_memory_utilization", "vllm_version"):
        return f"--{field.replace('_', '-')}"
    return field


def _cli_errors(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with a refused field renamed to the CLI flag that gave it."""
    try:
        return fn(*args)
    except DoesNotFitError:  # its message names the setting already
        raise
    except ConfigError as exc:
        raise ConfigError(_flag(exc.field), exc.value, exc.reason) from None


def _config_file(path: Path, flag: str) -> dict[str, Any]:
    data = load_json_file(path, error=lambda msg: CommandError(f"{flag} {msg}"))
    if not isinstance(data, dict):
        raise ConfigError(flag, str(path), "expected a JSON object (a config.json)")
    return data


def _dims(args: argparse.Namespace, report: Any) -> ModelDims | None:
    """ModelDims from the report's recorded dimensions, --model-config / --drafter-config
    overriding them; None when neither gives the model's."""
    model = None
    if args.model_config is not None:
        model = _config_file(args.model_config, "--model-config")
    elif args.drafter_config is not None and report.config.model_dims is None:
        raise ConfigError(
            "--drafter-config",
            str(args.drafter_config),
            "needs --model-config (the report records no model dimensions)",
        )
    drafter = None
    if args.drafter_config is not None:
        drafter = _config_file(args.drafter_config, "--drafter-config")
    return ModelDims.from_report(report, model, drafter=drafter)


def _write_plan(
    args: argparse.Namespace,
    comparison: EstimateComparison,
    kv_bytes: int | None,
    vllm_version: str | None,
) -> Path | None:
    if args.write_startup_plan is None:
        return None
    inputs = comparison.startup_plan
    if inputs is None:
        raise CommandError(
            f"{args.report}: estimate.startup_plan (fingerprint, free-memory baseline) "
            "is missing; only a running vLLM worker can compute them"
        )
    if not kv_bytes:
        raise CommandError(f"{args.report}: memest's KV budget is 0; no plan written")
    # The release that made the report reads the plan (its fingerprint is that release's).
    document = startup_plan_document(
        inputs.fingerprint, kv_bytes, inputs.free_memory_baseline_bytes, vllm_version=vllm_version
    )
    try:
        return write_startup_plan(args.write_startup_plan, document, replace=False)
    except FileExistsError as exc:
        raise CommandError(
            f"--write-startup-plan: {exc.filename2} exists (a plan for this configuration, "
            "perhaps the plugin's); remove it first to replace it"
        ) from None


def _as_json(out: dict[str, Any]) -> str:
    grid_result: WhatIf | None = out["what_if"]
    payload: dict[str, Any] = {
        "accounting": out["accounting"].model_dump(mode="json"),
        "comparison": out["comparison"].model_dump(mode="json"),
    }
    if grid_result is not None:
        payload["what_if"] = grid_result.model_dump(mode="json")
        payload["kv_cache_memory_bytes_to"] = grid_result.kv_budget_bytes_to
    payload["kv_cache_memory_bytes"] = out["kv_cache_memory_bytes"]
    if out["inverse"] is not None:
        payload["inverse"] = out["inverse"]
    plan_path = out["startup_plan_path"]
    payload["startup_plan_path"] = str(plan_path) if plan_path else None
    return json.dumps(payload, indent=2) + "\n"


def _as_text(out: dict[str, Any]) -> str:
    grid_result: WhatIf | None = out["what_if"]
    parts = [render_accounting(out["accounting"])]
    groups = kv_groups_table(out["accounting"].kv_groups, out["accounting"].max_model_len)
    growable = growable_table(out["accounting"].growable_kv)
    for table in (groups, growable):
        if table is not None:
            parts.append("\n" + "\n".join(text_lines([table])) + "\n")
    if grid_result is not None:
        parts.append("\nWhat-if\n\n" + render_what_if(grid_result))
        parts.append(_render_terms(out["terms"]))
    flag = kv_cache_flag(out["accounting"])
    if flag:
        parts.append(f"\nvLLM flag memest recommends: {flag}\n")
    if grid_result is not None and grid_result.kv_budget_bytes_to:
        parts.append(
            "vLLM flag for memest's budget under G': "
            f"{kv_cache_memory_flag(grid_result.kv_budget_bytes_to)}\n"
        )
    if out["inverse"] is not None:
        parts.append(_render_inverse(out["inverse"]))
    if out["startup_plan_path"] is not None:
        parts.append(f"Startup plan written: {out['startup_plan_path']}\n")
    return "".join(parts)


def _render_terms(terms: list[TermRow]) -> str:
    """Every full-initialization term at G and G' with the law that moved it."""
    lines = ["\n| term | G GiB | G' GiB | law |", "|---|---|---|---|"]
    for row in terms:
        lines.append(
            f"| {row.label} | {gib_cell(row.bytes_from)} | {gib_cell(row.bytes_to)} | {row.law} |"
        )
    return "\n".join(lines) + "\n"


def _render_inverse(answer: dict[str, Any]) -> str:
    lines = [
        f"\n{answer['kv_tokens']:,} KV tokens need gpu_memory_utilization >= "
        f"{answer['gpu_memory_utilization']} under this grid"
    ]
    if "largest_max_num_seqs" in answer:
        seqs, ceiling = answer["largest_max_num_seqs"], answer["max_num_seqs_ceiling"]
        if seqs is None:
            lines.append("no max_num_seqs keeps them at this utilization")
        elif seqs >= ceiling:
            lines.append(
                f"every max_num_seqs up to {ceiling} keeps them at this utilization "
                f"(the ceiling: {answer['max_num_seqs_ceiling_by']})"
            )
        else:
            lines.append(f"largest max_num_seqs that keeps them at this utilization: {seqs}")
    return "\n".join(lines) + "\n"


COMMAND = EstimateCommand()
