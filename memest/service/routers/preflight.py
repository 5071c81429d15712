"""POST /api/v1/preflight: the KV budget of a model never started, from its config.json and grid
(memest.preflight). Bad input is a 422 naming the field; nothing is stored."""

from __future__ import annotations

from fastapi import APIRouter, Request

from memest.errors import ConfigError
from memest.preflight import preflight
from memest.schema.preflight import PreflightRequest, PreflightResult
from memest.service import examples
from memest.service.deps import ReadAuth, SettingsDep
from memest.service.errors import BadRequest
from memest.service.ingest import load_json, read_body

router = APIRouter(prefix="/api/v1", tags=["calculators"], dependencies=[ReadAuth])


@router.post(
    "/preflight",
    response_model=PreflightResult,
    responses={
        **examples.json_example(examples.PREFLIGHT, "One rank's predicted terms and KV cache"),
        413: {"description": "Body larger than MEMEST_MAX_REPORT_BYTES"},
        415: {"description": "Not application/json"},
        422: {"description": "Invalid body, config or grid (the field is named)"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/PreflightRequest"},
                    "example": examples.PREFLIGHT_REQUEST,
                }
            },
        }
    },
)
async def preflight_route(request: Request, settings: SettingsDep) -> PreflightResult:
    """Predict every full-initialization term of one rank and the KV cache it leaves, from the
    model's config.json (inline, field ``model_config``) and vLLM's flags (memest.preflight)."""
    body = await read_body(request, settings.max_report_bytes)
    parsed = load_json(body, field="body")
    req = PreflightRequest.model_validate(parsed)
    try:
        return preflight(req)
    except ConfigError:
        raise  # a refused field: mapped to a 422 naming it (memest.service.errors)
    except (ValueError, ArithmeticError) as exc:  # absurd dimensions overflow a figure
        raise BadRequest(f"the config leads to no valid prediction: {exc}", field="body") from None
