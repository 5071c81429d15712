"""GET/POST /preflight: the pre-flight as a page, a form of vLLM's flags and a config.json, and
the table `memest preflight` prints (memest.reporters.preflight's rows, memest.preflight's
prediction). Nothing is stored; bad input shows the form again with the field named (422)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from memest.errors import ConfigError
from memest.reporters.preflight import closing_lines, heading_lines, kv_line, term_lines
from memest.schema.preflight import PreflightResult
from memest.service import calculations, examples
from memest.service.body import load_json
from memest.service.compute import ComputePool
from memest.service.deps import ComputeDep, ReadAuth, SettingsDep
from memest.service.errors import BadRequest, PayloadTooLarge, ServiceError
from memest.service.templating import HTML_PAGE, templates

router = APIRouter(tags=["dashboard"], dependencies=[ReadAuth])

#: The form's number fields, as vLLM names its flags; an empty one keeps vLLM's default.
INT_FIELDS = ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
#: The form's free-text fields besides the numbers and the config.
TEXT_FIELDS = ("gpu", "kv_cache_dtype", "quantization", "attention_backend")
#: JSON fields of the form (the config.json, vLLM's --speculative-config).
JSON_FIELDS = ("model_config", "speculative_config")
_FORM_FIELDS = (*INT_FIELDS, *TEXT_FIELDS, *JSON_FIELDS, "gpu_memory_utilization")


def _defaults() -> dict[str, str]:
    """What the form shows first: the API's example request (a Llama-3-8B config.json)."""
    values = {name: "" for name in _FORM_FIELDS}
    for name, value in examples.PREFLIGHT_REQUEST.items():
        values[name] = json.dumps(value, indent=1) if isinstance(value, dict) else str(value)
    return values


def _page(
    request: Request,
    form: dict[str, str],
    result: PreflightResult | None = None,
    error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    context: dict[str, Any] = {"title": "Pre-flight · memest", "form": form, "error": error}
    if result is not None:
        context.update(
            result=result,
            heading=heading_lines(result),
            rows=term_lines(result),
            kv=kv_line(result),
            closing=closing_lines(result),
        )
    return templates.TemplateResponse(request, "preflight.html", context, status_code=status)


@router.get("/preflight", response_class=HTMLResponse, responses=HTML_PAGE)
def preflight_form(request: Request) -> HTMLResponse:
    """The pre-flight form, filled with an example (a Llama-3-8B config.json)."""
    return _page(request, _defaults())


async def _read_form(request: Request, limit: int) -> dict[str, str]:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(
                f"form is larger than {limit} bytes (MEMEST_MAX_REPORT_BYTES)", field="body"
            )
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=len(_FORM_FIELDS) + 2)
    except ValueError:
        raise BadRequest(
            "the form has more fields than the pre-flight takes", field="body"
        ) from None
    return {k: v[0].strip() for k, v in fields.items() if k in _FORM_FIELDS and v}


def _request_fields(form: dict[str, str]) -> dict[str, Any]:
    """The form as pre-flight request fields (empty ones left to vLLM's defaults)."""
    fields: dict[str, Any] = {}
    for name in JSON_FIELDS:
        if form.get(name):
            fields[name] = load_json(form[name].encode(), field=name)
    for name in INT_FIELDS:
        if form.get(name):
            try:
                fields[name] = int(form[name])
            except ValueError:
                raise ConfigError(name, form[name], "expected a whole number") from None
    if form.get("gpu_memory_utilization"):
        try:
            fields["gpu_memory_utilization"] = float(form["gpu_memory_utilization"])
        except ValueError:
            raise ConfigError(
                "gpu_memory_utilization", form["gpu_memory_utilization"], "expected a number"
            ) from None
    fields.update({name: form[name] for name in TEXT_FIELDS if form.get(name)})
    if "model_config" not in fields:
        raise ConfigError("model_config", "", "paste the model's config.json")
    return fields


async def _predict(form: dict[str, str], pool: ComputePool) -> PreflightResult:
    """The prediction in a calculator worker, with the API's limits and deadline."""
    raw = json.dumps(_request_fields(form)).encode()
    return PreflightResult.model_validate_json(await pool.run(calculations.preflight_json, raw))


# A browser form, not an API (POST /api/v1/preflight is): kept out of the OpenAPI document.
@router.post("/preflight", include_in_schema=False)
async def preflight_submit(
    request: Request, settings: SettingsDep, pool: ComputeDep
) -> HTMLResponse:
    """Predict from the form and show the table under it; a refused field shows the form again."""
    form = {
        **{name: "" for name in _FORM_FIELDS},
        **await _read_form(request, settings.max_report_bytes),
    }
    try:
        result = await _predict(form, pool)
    except ConfigError as exc:
        return _page(request, form, error=str(exc), status=422)
    except ServiceError as exc:  # a refused field (4xx), or no worker in time (503/504)
        return _page(request, form, error=exc.message, status=exc.status_code)
    return _page(request, form, result=result)
