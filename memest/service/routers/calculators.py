"""The calculators over HTTP: GET /api/v1/plan (memest.plan), POST /api/v1/estimate and
POST /api/v1/what-if (memest.estimate). Refusals are mapped to HTTP in memest.service.errors."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from memest.estimate import compare
from memest.estimate.whatif import WhatIfQuestion, answer
from memest.preflight.calibration import what_if_calibration
from memest.schema import CapturePlan, EstimateComparison, RunReport, WhatIf
from memest.service import examples
from memest.service.deps import ReadAuth, SettingsDep
from memest.service.errors import Unavailable
from memest.service.ingest import check_storable, load_json, parse_report, read_body
from memest.service.plans import resolve_plan
from memest.service.routers.reports import _REPORT_BODY

router = APIRouter(prefix="/api/v1", tags=["calculators"], dependencies=[ReadAuth])

_PLAN_EXAMPLE = examples.REPORT["capture_plans"][0] if examples.REPORT["capture_plans"] else None


@router.get(
    "/plan",
    response_model=CapturePlan,
    responses={
        200: {
            "description": "The capture plan: graphs per runner",
            "content": {"application/json": {"example": _PLAN_EXAMPLE}} if _PLAN_EXAMPLE else {},
        },
        422: {"description": "memest.plan rejected a parameter (named in `field`)"},
        503: {"description": "memest.plan is not available"},
    },
)
def capture_plan(
    sizing: Annotated[
        Literal["seed", "vllm-0.33.0"],
        Query(description="seed: the five-field sizing; vllm-0.33.0: main's shared token list"),
    ] = "seed",
    gpu: Annotated[
        str,
        Query(description="GPU preset: gb200, b200, h100, h200", examples=["gb200"], max_length=64),
    ] = "gb200",
    max_num_seqs: Annotated[
        int, Query(ge=1, le=1 << 16, description="max_num_seqs", examples=[1024])
    ] = 1024,
    max_num_batched_tokens: Annotated[
        int, Query(ge=1, le=1 << 20, description="max_num_batched_tokens", examples=[16384])
    ] = 16384,
    speculative_method: Annotated[
        str | None,
        Query(description="eagle3, dspark, dflash, mtp, ...", examples=["dspark"], max_length=64),
    ] = None,
    num_speculative_tokens: Annotated[
        int, Query(ge=0, le=32, description="K, draft tokens per step", examples=[7])
    ] = 0,
    compilation_config: Annotated[
        str | None,
        Query(
            description="vLLM --compilation-config JSON: cudagraph_mode, the legacy sizing fields "
            "or the seed's five fields",
            examples=['{"max_decode_cudagraph_capture_requests": 512}'],
            max_length=4096,
        ),
    ] = None,
    adaptive_verification: Annotated[
        bool, Query(description="Target verification with variable query lengths")
    ] = False,
) -> CapturePlan:
    """Resolve a capture plan with memest.plan: how many graphs each runner captures and how wide
    (vLLM 0.33.0's sizing, or the seed's five fields)."""
    try:
        return resolve_plan(
            sizing=sizing,
            gpu=gpu,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            speculative_method=speculative_method,
            num_speculative_tokens=num_speculative_tokens,
            compilation_config=_checked_config(compilation_config),
            adaptive_verification=adaptive_verification,
        )
    except LookupError as exc:
        raise Unavailable(str(exc), field="memest.plan") from None


def _checked_config(text: str | None) -> dict[str, Any] | str | None:
    """The --compilation-config JSON, parsed with the body's limits (depth, finite numbers, int64);
    anything but an object goes on as text for memest.plan to name what is wrong."""
    if text is None:
        return None
    parsed = load_json(text.encode(), field="compilation_config")
    return parsed if isinstance(parsed, dict) else text


@router.post(
    "/estimate",
    response_model=EstimateComparison,
    openapi_extra=_REPORT_BODY,
    responses={
        **examples.json_example(examples.ESTIMATE),
        413: {"description": "Body larger than MEMEST_MAX_REPORT_BYTES"},
        415: {"description": "Not application/json"},
        422: {"description": "Not a valid RunReport, or the estimator cannot use it (why)"},
    },
)
async def estimate(request: Request, settings: SettingsDep) -> EstimateComparison:
    """KV-budget estimates for a RunReport (not stored): vLLM's, memest's full-initialization one
    and the measured end state, side by side (memest.estimate.compare). The report must be a
    complete start: phase readings, KV-cache spec and vLLM's figures."""
    body = await read_body(request, settings.max_report_bytes)
    return compare(parse_report(body))


class WhatIfRequest(BaseModel):
    """A measured start and the capture plan to predict for."""

    model_config = ConfigDict(extra="forbid")

    report: RunReport = Field(description="A complete start under grid G (plan, breakdown, phases)")
    plan: CapturePlan = Field(description="Grid G' (GET /api/v1/plan output)")


@router.post(
    "/what-if",
    response_model=WhatIf,
    responses={
        **examples.json_example(examples.WHAT_IF, "Predicted owners and KV budget under G'"),
        413: {"description": "Body larger than MEMEST_MAX_REPORT_BYTES"},
        415: {"description": "Not application/json"},
        422: {"description": "Invalid body, or the estimator cannot use the report (why)"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/WhatIfRequest"}}
            },
        }
    },
)
async def what_if_route(request: Request, settings: SettingsDep) -> WhatIf:
    """Predict each owner's pool memory and the KV budget of a measured start under another capture
    plan (memest.estimate.whatif.answer, as the CLI and POST /runs/{id}/estimate ask it)."""
    body = await read_body(request, settings.max_report_bytes)
    req = WhatIfRequest.model_validate_json(body)
    check_storable(req.report)
    question = WhatIfQuestion(grid=req.plan.model_dump(mode="json"))
    result = answer(req.report, question, calibration=what_if_calibration(req.report))
    return result.what_if
