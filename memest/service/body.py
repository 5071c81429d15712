"""The one request-body edge: every route with a body takes it typed, through BodyRoute.

BodyRoute (the route class of every router with a body) checks the route's tokens, then reads
its JSON body before FastAPI does: JSON only, at most MEMEST_MAX_REPORT_BYTES, within
BODY_READ_TIMEOUT_S of the first byte. The route's parameter is a JsonBody[Model]: the bytes,
typed as the model in the OpenAPI document. parse_body, where the work runs (a worker process:
validating a 2 MiB body holds the GIL for a third of a second, pickling the model back for
longer), applies the limits every stored or computed value needs (nesting depth, finite numbers,
int64, no lone surrogates), checks the schema version of each RunReport it holds and validates
the model; a refusal is a 4xx naming the field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar, get_args, get_origin

import anyio
from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, GetCoreSchemaHandler, ValidationError
from pydantic_core import core_schema

from memest.errors import field_errors
from memest.schema import SCHEMA_VERSION
from memest.service.deps import authorize
from memest.service.errors import (
    BadRequest,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    UnsupportedMediaType,
)
from memest.service.store import MAX_INT64

#: Deepest nesting of objects and arrays accepted in a body. Real reports nest less than 10
#: levels; the bound keeps every later parse and render of a stored report far from any
#: recursion limit.
MAX_JSON_DEPTH = 64
#: Errors a refused body names in its one-line detail: enough to fix a hand-edited report in
#: one pass, few enough that a body wrong everywhere still answers a readable line.
NAMED_ERRORS = 10
#: Seconds a client has to send a whole body (4 MiB take well under a second on any link a vLLM
#: host has to the service; a login form is a few hundred bytes).
BODY_READ_TIMEOUT_S = 30.0
_SURROGATE = re.compile("[\ud800-\udfff]")
M = TypeVar("M", bound=BaseModel)
#: Body fields that hold a RunReport (besides the body itself): their schema version is checked.
_REPORT_FIELDS = ("report",)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 once it passes ``limit`` bytes (before buffering it all)."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(
            f"the body must be JSON: Content-Type must be application/json, got {ctype!r}",
            field="content-type",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body is {int(declared)} bytes; the limit is {limit} (MEMEST_MAX_REPORT_BYTES)",
            field="body",
        )
    chunks: list[bytes] = []
    size = 0
    try:
        # One deadline for the whole body: a client trickling bytes cannot hold a connection
        # (and its memory) for longer.
        with anyio.fail_after(BODY_READ_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"request body exceeds {limit} bytes (MEMEST_MAX_REPORT_BYTES)",
                        field="body",
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"request body not received within {BODY_READ_TIMEOUT_S:g} s", field="body"
        ) from None
    return b"".join(chunks)


def load_json(body: bytes, field: str = "body") -> Any:
    """Parse JSON text; NaN, Infinity, over-deep nesting, integers past int64 and lone surrogates
    are a 422 naming ``field`` (or the path inside it)."""

    def reject_constant(name: str) -> None:
        raise BadRequest(f"{field} holds {name}: numbers must be finite", field=field)

    try:
        data = json.loads(body, parse_constant=reject_constant)
    except RecursionError:
        raise BadRequest(
            f"{field} is nested deeper than {MAX_JSON_DEPTH} levels", field=field
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers over 4300 digits
        why = "an integer has too many digits" if "digits" in str(exc) else str(exc)
        raise BadRequest(f"{field} is not valid JSON: {why}", field=field) from None
    bad = find_unstorable(data)
    if bad is not None:
        path, why = bad
        path = f"{field}.{path}" if path and field != "body" else path or field
        shown = path if len(path) <= 120 else path[:120] + "..."
        raise BadRequest(f"{shown} {why}", field=shown)
    return data


def find_unstorable(data: Any) -> tuple[str, str] | None:
    """The first value (its dotted path, what is wrong) that a report may not hold: nesting past
    MAX_JSON_DEPTH, an integer outside int64, a non-finite float, a lone surrogate in a string."""
    if _storable(data):
        return None
    return _first_unstorable(data)


def _storable(data: Any) -> bool:
    """True when find_unstorable finds nothing: the same checks without building paths (a valid
    report, the common case, costs one pass over its values and no tuple per value)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH or (depth == MAX_JSON_DEPTH and value):
            return False  # this value, or a child of it, lies deeper than the bound
        if isinstance(value, dict):
            for key, item in value.items():
                if not key.isascii() and _SURROGATE.search(key):
                    return False
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif _scalar_problem(item) is not None:
                    return False
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif _scalar_problem(item) is not None:
                    return False
        elif _scalar_problem(value) is not None:
            return False
    return True


def _first_unstorable(data: Any) -> tuple[str, str] | None:
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            return ".".join(path), f"is nested deeper than {MAX_JSON_DEPTH} levels"
        why = _scalar_problem(value)
        if why is not None:
            return ".".join(path), why
        if isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return ".".join(path), "has a key with a lone surrogate (not valid UTF-8)"
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value))
    return None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) > MAX_INT64:
        return "does not fit in a signed 64-bit integer"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
        return "holds a lone surrogate (not valid UTF-8)"
    return None


def check_schema_versions(data: dict[str, Any]) -> None:
    """The schema version of a RunReport body, or of one under a field of _REPORT_FIELDS."""
    places = [("", data)] + [
        (f"{k}.", data[k]) for k in _REPORT_FIELDS if isinstance(data.get(k), dict)
    ]
    for prefix, item in places:
        if "schema_version" not in item or "run_id" not in item:
            continue  # not a report (a report without the field is version 1)
        version = item["schema_version"]
        if version != SCHEMA_VERSION:
            raise BadRequest(
                f"schema_version {version!r} is not supported; this server reads "
                f"{SCHEMA_VERSION!r}",
                field=f"{prefix}schema_version",
            )


def parse_body(body: bytes, model: type[M]) -> M:
    """A JSON body as ``model``, with every limit of load_json; a 422 names the field at fault
    (up to NAMED_ERRORS of them in its one line)."""
    data = load_json(body)
    if not isinstance(data, dict):
        raise BadRequest(f"body must be a JSON object (one {model.__name__})", field="body")
    check_schema_versions(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = field_errors(exc, NAMED_ERRORS)
        detail = "; ".join(f"{p.field or 'body'}: {p.message}" for p in problems)
        raise BadRequest(
            f"invalid {model.__name__}: {detail}", field=problems[0].field or "body"
        ) from None


class JsonBody(Generic[M]):
    """A route's JSON body of model ``M``, held as its bytes: read within the limits of
    read_body on the event loop, parsed and validated (parse_body) where the work runs, in a
    worker process. Typed as ``M`` in the OpenAPI document; only BodyRoute makes one."""

    def __init__(self, raw: bytes, model: type[M]) -> None:
        self.raw = raw
        self.model = model

    def parse(self) -> M:
        return parse_body(self.raw, self.model)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        (model,) = get_args(source)
        return core_schema.json_or_python_schema(
            json_schema=handler.generate_schema(model),  # what the OpenAPI document shows
            python_schema=core_schema.is_instance_schema(cls),  # what FastAPI is handed
        )


class BodyRoute(APIRoute):
    """An APIRoute whose body parameter is a JsonBody: the tokens are checked first, then the
    body read within its limits and handed over unparsed (routes without a body are served as
    by APIRoute)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler
        annotation = self.body_field.field_info.annotation
        if get_origin(annotation) is not JsonBody:
            raise TypeError(f"{self.path}: a body must be a JsonBody[Model], not {annotation!r}")
        (model,) = get_args(annotation)

        async def bounded(request: Request) -> Response:
            settings = request.app.state.settings
            # Tokens first: no client the route refuses gets its body read.
            await authorize(request, self.dependencies)
            try:
                body = await read_body(request, settings.max_report_bytes)
            except ServiceError:
                self.refused(request)
                raise
            # Starlette's Request caches these: FastAPI takes the JsonBody as the parsed JSON.
            request._body = body
            request._json = JsonBody(body, model)
            return await handler(request)

        return bounded

    def refused(self, request: Request) -> None:
        """Called when a body is refused (a subclass counts it)."""
