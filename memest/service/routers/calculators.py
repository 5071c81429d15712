"""The calculators over HTTP: GET /api/v1/plan (memest.plan), POST /api/v1/estimate and
POST /api/v1/what-if (memest.estimate). Refusals are mapped to HTTP in memest.service.errors."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Response

from memest.schema import CapturePlan, EstimateComparison, RunReport, WhatIf
from memest.service import calculations, examples
from memest.service.body import BodyRoute, JsonBody
from memest.service.calculations import WhatIfRequest
from memest.service.deps import ComputeDep, ReadAuth

router = APIRouter(
    prefix="/api/v1", tags=["calculators"], dependencies=[ReadAuth], route_class=BodyRoute
)

_PLAN_EXAMPLE = examples.REPORT["capture_plans"][0] if examples.REPORT["capture_plans"] else None


@router.get(
    "/plan",
    response_model=CapturePlan,
    responses={
        200: {
            "description": "The capture plan: graphs per runner",
            "content": {"application/json": {"example": _PLAN_EXAMPLE}} if _PLAN_EXAMPLE else {},
        },
        422: {
            "description": "memest.plan rejected a parameter, or the plan it resolves is past "
            "memest.service.limits (named in `field`)"
        },
        503: {"description": "memest.plan is not available, or no calculator worker was free"},
        504: {"description": "The computation ran past MEMEST_COMPUTE_DEADLINE_S and was stopped"},
    },
)
async def capture_plan(
    pool: ComputeDep,
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
) -> Response:
    """Resolve a capture plan with memest.plan: how many graphs each runner captures and how wide
    (vLLM 0.33.0's sizing, or the seed's five fields), in a calculator worker."""
    query = {
        "sizing": sizing,
        "gpu": gpu,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "speculative_method": speculative_method,
        "num_speculative_tokens": num_speculative_tokens,
        "compilation_config": compilation_config,
        "adaptive_verification": adaptive_verification,
    }
    body = await pool.run(calculations.plan_json, query)
    return Response(body, media_type="application/json")


CALCULATOR_ANSWERS: dict[int | str, dict[str, Any]] = {
    413: {"description": "Body larger than MEMEST_MAX_REPORT_BYTES"},
    415: {"description": "Not application/json"},
    422: {
        "description": "A refused field (named in `field`): invalid, past a limit of "
        "memest.service.limits, or a report the estimator cannot use"
    },
    503: {"description": "No calculator worker was free within MEMEST_COMPUTE_DEADLINE_S"},
    504: {"description": "The computation ran past MEMEST_COMPUTE_DEADLINE_S and was stopped"},
}

ReportBody = Annotated[
    JsonBody[RunReport],
    Body(
        description="A complete start: phase readings, KV-cache spec and vLLM's figures",
        openapi_examples={"report": {"value": examples.REPORT}},
    ),
]


@router.post(
    "/estimate",
    response_model=EstimateComparison,
    responses={**examples.json_example(examples.ESTIMATE), **CALCULATOR_ANSWERS},
)
async def estimate(report: ReportBody, pool: ComputeDep) -> Response:
    """KV-budget estimates for a RunReport (not stored): vLLM's, memest's full-initialization one
    and the measured end state, side by side (memest.estimate.compare). The report must be a
    complete start: phase readings, KV-cache spec and vLLM's figures."""
    body = await pool.run(calculations.estimate_json, report.raw)
    return Response(body, media_type="application/json")


@router.post(
    "/what-if",
    response_model=WhatIf,
    responses={
        **examples.json_example(examples.WHAT_IF, "Predicted owners and KV budget under G'"),
        **CALCULATOR_ANSWERS,
    },
)
async def what_if_route(req: JsonBody[WhatIfRequest], pool: ComputeDep) -> Response:
    """Predict each owner's pool memory and the KV budget of a measured start under another capture
    plan (memest.estimate.whatif.answer, as the CLI and POST /runs/{id}/estimate ask it)."""
    body = await pool.run(calculations.what_if_json, req.raw)
    return Response(body, media_type="application/json")
