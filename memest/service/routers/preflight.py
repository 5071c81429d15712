"""POST /api/v1/preflight: the KV budget of a model never started, from its config.json and grid
(memest.preflight), computed in a calculator worker (memest.service.compute). Bad input is a 422
naming the field; nothing is stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Response

from memest.schema.preflight import PreflightRequest, PreflightResult
from memest.service import calculations, examples
from memest.service.body import BodyRoute, JsonBody
from memest.service.deps import ComputeDep, ReadAuth
from memest.service.routers.calculators import CALCULATOR_ANSWERS

router = APIRouter(
    prefix="/api/v1", tags=["calculators"], dependencies=[ReadAuth], route_class=BodyRoute
)

PreflightBody = Annotated[
    JsonBody[PreflightRequest],
    Body(openapi_examples={"llama-8b": {"value": examples.PREFLIGHT_REQUEST}}),
]


@router.post(
    "/preflight",
    response_model=PreflightResult,
    responses={
        **examples.json_example(examples.PREFLIGHT, "One rank's predicted terms and KV cache"),
        **CALCULATOR_ANSWERS,
    },
)
async def preflight_route(req: PreflightBody, pool: ComputeDep) -> Response:
    """Predict every full-initialization term of one rank and the KV cache it leaves, from the
    model's config.json (inline, field ``model_config``) and vLLM's flags (memest.preflight)."""
    body = await pool.run(calculations.preflight_json, req.raw)
    return Response(body, media_type="application/json")
