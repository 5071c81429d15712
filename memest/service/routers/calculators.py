"""The calculators over HTTP: GET /api/v1/plan (memest.plan) and POST /api/v1/estimate
(memest.estimate). A missing calculator is a 503 that names it."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from memest.errors import ConfigError
from memest.schema import CapturePlan, EstimateComparison
from memest.service import examples
from memest.service.deps import ReadAuth, SettingsDep
from memest.service.errors import BadRequest, Unavailable
from memest.service.estimates import compare_report
from memest.service.ingest import parse_report, read_body
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
        503: {"description": "memest.plan provides no resolver"},
    },
)
def capture_plan(
    sizing: Annotated[
        Literal["seed", "vllm-0.33.0"],
        Query(description="seed: the five-field sizing; vllm-0.33.0: main's shared list"),
    ] = "seed",
    gpu: Annotated[
        str, Query(description="GPU preset, e.g. gb200, h200", examples=["gb200"], max_length=64)
    ] = "gb200",
    max_num_seqs: Annotated[
        int, Query(ge=1, le=1 << 20, description="max_num_seqs", examples=[1024])
    ] = 1024,
    max_num_batched_tokens: Annotated[
        int, Query(ge=1, le=1 << 24, description="max_num_batched_tokens", examples=[16384])
    ] = 16384,
    speculative_method: Annotated[
        str | None,
        Query(description="eagle3, dspark, dflash, mtp, ...", examples=["dspark"], max_length=64),
    ] = None,
    num_speculative_tokens: Annotated[
        int, Query(ge=0, le=64, description="K, draft tokens per step", examples=[7])
    ] = 0,
) -> CapturePlan:
    """Resolve a capture plan with memest.plan: how many graphs each runner captures and how wide."""
    try:
        return resolve_plan(
            sizing=sizing,
            gpu=gpu,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            speculative_method=speculative_method,
            num_speculative_tokens=num_speculative_tokens,
        )
    except LookupError as exc:
        raise Unavailable(str(exc), field="memest.plan") from None
    except ConfigError as exc:
        raise BadRequest(str(exc), field=exc.field) from None


@router.post(
    "/estimate",
    response_model=EstimateComparison,
    openapi_extra=_REPORT_BODY,
    responses={
        **examples.json_example(examples.ESTIMATE),
        413: {"description": "Body larger than MEMEST_MAX_REPORT_BYTES"},
        415: {"description": "Not application/json"},
        422: {"description": "Not a valid RunReport, or the estimator rejected it"},
        503: {"description": "memest.estimate.compare is not available"},
    },
)
async def estimate(request: Request, settings: SettingsDep) -> EstimateComparison:
    """KV-budget estimates for a RunReport (not stored): vLLM's, memest's full-initialization one
    and the measured end state, side by side (memest.estimate.compare)."""
    body = await read_body(request, settings.max_report_bytes)
    report = parse_report(body)
    try:
        return compare_report(report)
    except LookupError as exc:
        raise Unavailable(str(exc), field="memest.estimate") from None
    except ConfigError as exc:
        raise BadRequest(str(exc), field=exc.field) from None
