"""Capture plan per runner: the seed's five capture fields beside vLLM 0.33.0's sizing.

memest plan [--gpu gb200|b200|h100|h200] [--max-num-seqs N] [--max-num-batched-tokens N]
            [--spec-method METHOD --num-spec-tokens K] [--dynamic-sd TIERS]
            [--adaptive-verification] [--interactivity] [--compilation-config JSON]
            [--prefill-batches DIST] [--decode-batches DIST] [--vllm-version X.Y.Z] [--json]

Prints one row per runner (per dynamic-SD tier): graph count, widest shape (requests × q =
tokens) and the sum of captured tokens, for two sizings: "seed" (the seed's proposal: five
capture fields) and "main" (vLLM 0.33.0 as released, what a start runs today; its --json key is
"vllm-0.33.0"). Defaults follow `vllm serve`: gb200/b200 (SM100) 1024 sequences / 16384 batched
tokens; h100/h200 1024 / 8192. max_num_seqs above max_num_batched_tokens is refused, as vLLM
0.33.0 refuses it.

--compilation-config takes the same JSON as vLLM's flag: cudagraph_mode (both sizings),
cudagraph_capture_sizes and max_cudagraph_capture_size (main), the five fields
max_prefill_cudagraph_capture_tokens, prefill_cudagraph_capture_token_sizes,
max_decode_cudagraph_capture_requests, decode_cudagraph_capture_request_sizes,
max_decode_cudagraph_capture_tokens (seed), and vLLM 0.33.0's other CompilationConfig fields
(read by neither: they change no capture size); any other key is refused. A line above the table
names each key given, the sizing that reads it and whether it changed that plan.
--dynamic-sd takes "1-16:7,17-256:3,257-1024:1" or JSON [[1, 16, 7], ...] (start, end, K).
--prefill-batches (tokens per mixed step) and --decode-batches (requests per uniform decode)
take "uniform:LOW-HIGH" or a JSON histogram {"size": weight}; the expected padded tokens per
step are then printed for both sizings: --prefill-batches on target PIECEWISE, --decode-batches
on target FULL. "padding" is over the steps a graph covers; "of all tokens" also counts the
steps wider than the grid, which run unpadded.
--vllm-version (0.33.0 or 0.34.0) adds a line naming the sizing that release runs
(memest.plan.SIZING_BY_VERSION): vLLM 0.33.0 runs "main"; vLLM 0.34.0 sizes with the five fields,
resolved off SM100 as the seed resolves them (its SM100 prefill grid differs); --json adds
"vllm_version" and "vllm_sizing".
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memest.errors import CommandError, ConfigError
from memest.files import parse_json
from memest.plan import (
    GPU_PRESETS,
    SERVE_DEFAULTS,
    SIZING_LEGEND,
    SIZING_NAMES,
    SPEC_METHODS,
    expected_padding,
    gpu_preset,
    plan_input_from_compilation_config,
    release_sizing,
    resolve_both,
    uniform_histogram,
)
from memest.plan.inputs import LEGACY_FIELDS, SEED_FIELDS, PlanInput
from memest.plan.vllm033 import dynamic_sd_lookup
from memest.reporters.plan_table import PlanTable
from memest.schema.plan import CapturePlan

MAX_BATCH_SIZE = 1 << 20
"""Largest batch size a --prefill-batches / --decode-batches range may reach."""


def _short(text: str) -> str:
    """The offending value as an error line shows it: long inline JSON is cut."""
    return text if len(text) <= 60 else text[:57] + "..."


def _inline_json(name: str, text: str) -> Any:
    """JSON given on the command line, refused in one line when malformed or nested too deep."""
    return parse_json(text.encode("utf-8", "surrogateescape"), source=name, error=CommandError)


def parse_dynamic_sd(text: str) -> list[list[int]]:
    """``"1-16:7,17-256:3"`` or JSON ``[[1, 16, 7], ...]`` → [[start, end, K], ...]."""
    text = text.strip()
    try:
        if text.startswith("["):
            rows = _inline_json("--dynamic-sd", text)
            if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) for x in r)
                for r in rows
            ):
                raise ValueError("expected [[start, end, K], ...]")
            return rows
        out = []
        for part in text.split(","):
            span, k = part.split(":")
            start, end = span.split("-")
            out.append([int(start), int(end), int(k)])
        return out
    except ValueError as exc:
        raise ConfigError(
            "--dynamic-sd", _short(text), f"expected 'START-END:K,...' ({exc})"
        ) from None


def parse_distribution(name: str, text: str) -> dict[int, float]:
    """``"uniform:LOW-HIGH"`` or a JSON histogram ``{"size": weight}``."""
    text = text.strip()
    if text.startswith("uniform:"):
        try:
            low, high = (int(x) for x in text[len("uniform:") :].split("-"))
        except ValueError:
            raise ConfigError(name, _short(text), "expected uniform:LOW-HIGH") from None
        if high > MAX_BATCH_SIZE:  # one histogram entry per size: bound the memory
            raise ConfigError(name, text, f"HIGH above {MAX_BATCH_SIZE:,}")
        return uniform_histogram(low, high)
    try:
        raw = _inline_json(name, text)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        return {int(k): float(v) for k, v in raw.items()}
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            name, _short(text), f"expected uniform:LOW-HIGH or {{size: weight}} ({exc})"
        ) from None


def _padding(
    plans: tuple[CapturePlan, CapturePlan],
    prefill: dict[int, float] | None,
    decode: dict[int, float] | None,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for plan in plans:
        for row in plan.runners:
            if row.runner == "target.piecewise" and prefill is not None:
                hist, q = prefill, 1
            elif row.runner == "target.full" and decode is not None:
                hist, q = decode, row.q
                if row.tier_k is not None and plan.dynamic_sd_schedule is not None:
                    # a tier only runs the batch sizes the schedule gives its K
                    schedule = tuple(tuple(r) for r in plan.dynamic_sd_schedule)
                    dense = dynamic_sd_lookup(
                        schedule,  # type: ignore[arg-type]
                        plan.max_num_seqs,
                        plan.num_speculative_tokens,
                    )
                    hist = {
                        n: w
                        for n, w in decode.items()
                        if n <= plan.max_num_seqs and dense[n] == row.tier_k
                    }
                    if not hist:
                        continue
            else:
                continue
            cost = expected_padding(row.sizes, hist, q=q)
            out.append(
                {
                    "sizing": plan.sizing,
                    "runner": row.runner,
                    "q": row.q,
                    "tier_k": row.tier_k,
                    "mean_real_tokens": cost.mean_real_tokens,
                    "mean_padded_tokens": cost.mean_padded_tokens,
                    "mean_padding_tokens": cost.mean_padding_tokens,
                    "padding_ratio": cost.padding_ratio,
                    "overall_padding_ratio": cost.overall_padding_ratio,
                    "eager_fraction": cost.eager_fraction,
                }
            )
    return out


class PlanCommand:
    name = "plan"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--gpu", default="gb200", help=f"preset: {', '.join(GPU_PRESETS)}")
        parser.add_argument("--max-num-seqs", type=int, default=None)
        parser.add_argument("--max-num-batched-tokens", type=int, default=None)
        parser.add_argument(
            "--spec-method", default=None, help=f"one of {', '.join(sorted(SPEC_METHODS))}"
        )
        parser.add_argument("--num-spec-tokens", type=int, default=0, help="K")
        parser.add_argument("--dynamic-sd", default=None, help="tiers START-END:K,...")
        parser.add_argument("--adaptive-verification", action="store_true")
        parser.add_argument(
            "--interactivity", action="store_true", help="vLLM performance_mode=interactivity"
        )
        parser.add_argument("--compilation-config", default=None, help="JSON, as vLLM's flag")
        parser.add_argument("--prefill-batches", default=None, help="tokens per mixed step")
        parser.add_argument("--decode-batches", default=None, help="requests per decode step")
        parser.add_argument(
            "--vllm-version",
            metavar="X.Y.Z",
            help="name the sizing this vLLM release runs (0.33.0: main, 0.34.0: the five fields)",
        )
        parser.add_argument("--json", action="store_true", help="print both plans as JSON")

    def run(self, args: argparse.Namespace) -> int:
        inp = _plan_input(args, args.compilation_config)
        plans = resolve_both(inp)
        release = None if args.vllm_version is None else release_sizing(args.vllm_version)
        prefill = (
            None
            if args.prefill_batches is None
            else parse_distribution("--prefill-batches", args.prefill_batches)
        )
        decode = (
            None
            if args.decode_batches is None
            else parse_distribution("--decode-batches", args.decode_batches)
        )
        padding = _padding(plans, prefill, decode)
        if args.json:
            doc: dict[str, Any] = {
                "seed": plans[0].model_dump(mode="json"),
                "vllm-0.33.0": plans[1].model_dump(mode="json"),
            }
            if padding:
                doc["padding"] = padding
            if release is not None:
                doc["vllm_version"], doc["vllm_sizing"] = args.vllm_version, release
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0
        if release is not None:
            sys.stdout.write(
                f"vLLM {args.vllm_version} runs the {SIZING_NAMES[release]} sizing below\n"
            )
        if args.compilation_config is not None:
            sys.stdout.write(_override_line(args, plans))
        sys.stdout.write(PlanTable.from_plans(*plans).render())
        if padding:
            sys.stdout.write(f"\nExpected padding per step, in tokens ({SIZING_LEGEND})\n")
            for p in padding:
                tier = "" if p["tier_k"] is None else f" (K={p['tier_k']})"
                sys.stdout.write(
                    f"  {SIZING_NAMES[p['sizing']]:<5} {p['runner']}{tier}: "
                    f"real {p['mean_real_tokens']:.1f}, padded {p['mean_padded_tokens']:.1f}, "
                    f"padding {p['padding_ratio']:.2%} of graphed steps' tokens "
                    f"({p['overall_padding_ratio']:.2%} of all tokens), "
                    f"beyond the grid {p['eager_fraction']:.1%} of steps\n"
                )
        return 0


def _plan_input(args: argparse.Namespace, compilation_config: str | None) -> PlanInput:
    sm100 = gpu_preset(args.gpu)
    seqs_default, mnbt_default = SERVE_DEFAULTS[sm100]
    dynamic = None if args.dynamic_sd is None else parse_dynamic_sd(args.dynamic_sd)
    return plan_input_from_compilation_config(
        compilation_config,
        sm100=sm100,
        max_num_seqs=args.max_num_seqs if args.max_num_seqs is not None else seqs_default,
        max_num_batched_tokens=args.max_num_batched_tokens
        if args.max_num_batched_tokens is not None
        else mnbt_default,
        spec_method=args.spec_method,
        num_speculative_tokens=args.num_spec_tokens,
        dynamic_sd=dynamic,
        adaptive_verification=args.adaptive_verification,
        performance_mode="interactivity" if args.interactivity else "balanced",
        gpu=args.gpu.lower(),
    )


def _reader(key: str) -> str:
    if key in SEED_FIELDS:
        return "seed"
    if key in LEGACY_FIELDS:
        return "main"
    return "both" if key == "cudagraph_mode" else "neither"


def _override_line(args: argparse.Namespace, plans: tuple[CapturePlan, CapturePlan]) -> str:
    """Which sizing reads each --compilation-config key, and whether the plan moved."""
    given = _inline_json("--compilation-config", args.compilation_config)
    without = resolve_both(_plan_input(args, None))
    moved = [
        SIZING_NAMES[p.sizing]
        for p, q in zip(plans, without, strict=True)
        if p.runners != q.runners
    ]
    keys = ", ".join(f"{k}={json.dumps(v)} (read by {_reader(k)})" for k, v in given.items())
    effect = (
        f"changes the {' and '.join(moved)} plan"
        if moved
        else "changes neither plan (same as without it)"
    )
    return f"--compilation-config: {keys or 'no field'}; {effect}\n"


COMMAND = PlanCommand()
