"""Input limits of the service's calculators (pre-flight, what-if, estimates, and a stored run a
calculator is asked about), each derived from what real models and real starts have, with room
to spare; past one the answer is a 422 naming the field.

Every calculator is linear (or n log n) in its input, but the input itself is the client's:
a config.json with 10^7 layers, or a report with 30,000 stages, would still hold a worker
(and its memory) for minutes. These bounds keep a request's work to seconds while no real
model comes near them:

- layers: the largest public decoders have 126 (Llama 3.1 405B), 96 (Nemotron-4 340B), 94
  (Qwen3-235B), 61 (DeepSeek-V3): MAX_LAYERS is twice the largest;
- routed experts: 512 (Qwen3-Next), 384 (Kimi K2), 256 (DeepSeek-V3): twice the largest;
- capture sizes: vLLM's default list for max_cudagraph_capture_size=8192 has about 530;
- a report's breakdown: the starts under tests/data/reports have at most 10 stages, 24
  triggers, 167 live peaks and 5 runners of 53 sizes each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any

from memest.schema import CapturePlan, RunReport
from memest.service.errors import BadRequest

MAX_LAYERS = 256
MAX_EXPERTS = 1024
MAX_CAPTURE_SIZES = 1024
#: Capture plans in one report (one per model runner kind: target, drafter, encoder, ...).
MAX_CAPTURE_PLANS = 16
#: Runners of one capture plan.
MAX_RUNNERS = 64
#: Stage rows of one breakdown (each capture stage of each runner, and the phases): 100x the
#: most a real start has.
MAX_STAGES = 1024
#: Rows of each other list of a breakdown (triggers, live peaks, retained, pools, ...): 49x the
#: most a real start has.
MAX_ROWS = 8192

#: config.json keys that count layers and routed experts (Hugging Face names across families).
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "num_nextn_predict_layers")
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
#: Where a multimodal config nests its language model's config.
_NESTED = ("text_config", "language_config", "llm_config")


def refuse(field: str, count: int, limit: int, what: str) -> BadRequest:
    return BadRequest(f"{field} has {count} {what}; the service takes at most {limit}", field=field)


def check_model_config(config: Mapping[str, Any] | None, field: str) -> None:
    """Layers and experts of a Hugging Face config.json (and of its nested text config)."""
    if not isinstance(config, Mapping):
        return
    for key in _LAYER_KEYS:
        _check_count(config.get(key), f"{field}.{key}", MAX_LAYERS, "layers")
    for key in _EXPERT_KEYS:
        _check_count(config.get(key), f"{field}.{key}", MAX_EXPERTS, "experts")
    for key in _NESTED:
        nested = config.get(key)
        if isinstance(nested, Mapping):
            check_model_config(nested, f"{field}.{key}")


def _check_count(value: Any, field: str, limit: int, what: str) -> None:
    # Only integers are counted here; a value of another type is the calculator's to refuse.
    if isinstance(value, int) and not isinstance(value, bool) and value > limit:
        raise refuse(field, value, limit, what)


def check_capture_sizes(sizes: Any, field: str) -> None:
    if isinstance(sizes, list) and len(sizes) > MAX_CAPTURE_SIZES:
        raise refuse(field, len(sizes), MAX_CAPTURE_SIZES, "capture sizes")


def check_compilation_config(config: Mapping[str, Any] | None, field: str) -> None:
    """vLLM's --compilation-config: its explicit capture-size lists."""
    if not isinstance(config, Mapping):
        return
    for key in ("cudagraph_capture_sizes", "compile_sizes"):
        check_capture_sizes(config.get(key), f"{field}.{key}")


def check_plan(plan: CapturePlan, field: str) -> None:
    _check_len(plan.runners, f"{field}.runners", MAX_RUNNERS, "runners")
    for i, runner in enumerate(plan.runners):
        check_capture_sizes(runner.sizes, f"{field}.runners.{i}.sizes")
    check_capture_sizes(plan.cudagraph_capture_sizes, f"{field}.cudagraph_capture_sizes")


def check_resolved_plan(plan: CapturePlan, field: str) -> None:
    """A plan a query resolves (GET /api/v1/plan) holds no more runners and capture sizes than a
    plan the what-if takes: ``field`` names the parameter that sets its grid (a
    max_cudagraph_capture_size of 10^6 resolves to 70,000 sizes, a 1.4 MB answer)."""
    if len(plan.runners) > MAX_RUNNERS:
        raise refuse(field, len(plan.runners), MAX_RUNNERS, "runners in its plan")
    for runner in plan.runners:
        if len(runner.sizes) > MAX_CAPTURE_SIZES:
            raise BadRequest(
                f"{field} resolves to {len(runner.sizes)} capture sizes for {runner.runner}; "
                f"the service takes at most {MAX_CAPTURE_SIZES} per runner",
                field=field,
            )
    sizes = plan.cudagraph_capture_sizes or []
    if len(sizes) > MAX_CAPTURE_SIZES:
        raise refuse(field, len(sizes), MAX_CAPTURE_SIZES, "capture sizes in its plan")


def check_report(report: RunReport, field: str = "") -> None:
    """A report's plans, breakdown rows and recorded model shape."""
    at = f"{field}." if field else ""
    _check_len(report.capture_plans, f"{at}capture_plans", MAX_CAPTURE_PLANS, "plans")
    for i, plan in enumerate(report.capture_plans):
        check_plan(plan, f"{at}capture_plans.{i}")
    bd = report.breakdown
    if bd is not None:
        _check_len(bd.stages, f"{at}breakdown.stages", MAX_STAGES, "stages")
        for name in ("phases", "triggers", "live_peaks", "retained", "unattributed", "pools"):
            _check_len(getattr(bd, name), f"{at}breakdown.{name}", MAX_ROWS, "rows")
    _check_len(report.phases, f"{at}phases", MAX_ROWS, "phases")
    for name in ("model_dims", "drafter_dims"):
        shape = getattr(report.config, name)
        if shape is not None:
            check_model_config(shape.model_dump(), f"{at}config.{name}")


def _check_len(items: Sized | None, field: str, limit: int, what: str) -> None:
    count = len(items) if items is not None else 0
    if count > limit:
        raise refuse(field, count, limit, what)
