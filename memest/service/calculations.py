"""What the calculator routes compute, as the worker processes run it (memest.service.compute):
the capture plan of a query, the body parsed with its limits (memest.service.body.parse_body), the input limits
(memest.service.limits), then memest's calculators, answered as JSON bytes. Each is a
module-level function of bytes and strings: a pydantic model pickles slowly (a 2 MiB report
takes longer to pickle than to validate), so none crosses the process boundary."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memest.schema import CapturePlan, RunReport
from memest.schema.preflight import PreflightRequest
from memest.service import limits
from memest.service.body import load_json, parse_body
from memest.service.errors import Unavailable


class WhatIfRequest(BaseModel):
    """A measured start and the capture plan to predict for."""

    model_config = ConfigDict(extra="forbid")

    report: RunReport = Field(description="A complete start under grid G (plan, breakdown, phases)")
    plan: CapturePlan = Field(description="Grid G' (GET /api/v1/plan output)")
    vllm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The vLLM release G' runs (0.33.0 or 0.34.0; unset: the installed one, "
        "else the newest supported), as `memest estimate --vllm-version` takes it",
    )


def preflight_json(raw: bytes) -> bytes:
    from memest.preflight import preflight

    req = parse_body(raw, PreflightRequest)
    limits.check_model_config(req.model_config_json, "model_config")
    limits.check_model_config(req.draft_model_config, "draft_model_config")
    limits.check_compilation_config(req.compilation_config, "compilation_config")
    return preflight(req).model_dump_json().encode()


def what_if_json(raw: bytes) -> bytes:
    from memest.estimate.whatif import WhatIfQuestion, answer
    from memest.preflight.calibration import what_if_calibration
    from memest.service.ingest import check_storable

    req = parse_body(raw, WhatIfRequest)
    check_storable(req.report)
    limits.check_report(req.report, "report")
    limits.check_plan(req.plan, "plan")
    question = WhatIfQuestion(grid=req.plan.model_dump(mode="json"), vllm_version=req.vllm_version)
    result = answer(req.report, question, calibration=what_if_calibration(req.report))
    return result.what_if.model_dump_json().encode()


def estimate_json(raw: bytes) -> bytes:
    from memest.estimate import compare
    from memest.service.ingest import finish_report

    report = parse_body(raw, RunReport)
    limits.check_report(report)
    return compare(finish_report(report)).model_dump_json().encode()


def run_estimate_json(run_id: str, payloads: dict[int, str], raw: bytes) -> bytes:
    """POST /runs/{id}/estimate: the RunEstimateRequest ``raw`` on the stored report of the rank
    it names (``payloads`` by rank; default the lowest)."""
    from memest.service.errors import NotFound
    from memest.service.estimates import RunEstimateRequest, run_estimate

    body = parse_body(raw, RunEstimateRequest)
    rank = min(payloads) if body.rank is None else body.rank
    if rank not in payloads:
        raise NotFound(f"run {run_id!r} has no rank {rank}", field="rank")
    report = RunReport.model_validate_json(payloads[rank])
    limits.check_report(report)
    limits.check_model_config(body.model_dims, "model_dims")
    limits.check_model_config(body.drafter_dims, "drafter_dims")
    compilation = body.grid.get("compilation_config")
    limits.check_compilation_config(
        compilation if isinstance(compilation, dict) else None, "grid.compilation_config"
    )
    return run_estimate(report, body).model_dump_json().encode()


def plan_json(query: dict[str, Any]) -> bytes:
    """GET /api/v1/plan: the capture plan of the query's parameters (memest.plan), its
    --compilation-config JSON parsed with the body's limits, and the plan within the capture
    sizes and runners a plan sent to the what-if may have."""
    from memest.service.plans import resolve_plan

    text = query.get("compilation_config")
    compilation = checked_compilation_config(text)
    try:
        plan = resolve_plan(**{**query, "compilation_config": compilation})
    except LookupError as exc:
        raise Unavailable(str(exc), field="memest.plan") from None
    limits.check_resolved_plan(plan, "compilation_config" if text else "max_num_batched_tokens")
    return plan.model_dump_json().encode()


def checked_compilation_config(text: str | None) -> dict[str, Any] | str | None:
    """The --compilation-config JSON, parsed with the body's limits (depth, finite numbers,
    int64) and its capture-size lists within the limit; anything but an object goes on as text
    for memest.plan to name what is wrong."""
    if text is None:
        return None
    parsed = load_json(text.encode(), field="compilation_config")
    if not isinstance(parsed, dict):
        return text
    limits.check_compilation_config(parsed, "compilation_config")
    return parsed
