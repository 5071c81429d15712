"""The page templates and the filters they format figures with (one Jinja environment shared by
every HTML route)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.templating import Jinja2Templates
from jinja2 import pass_context
from markupsafe import Markup, escape

from memest.reporters import plots, plots_history
from memest.reporters.owners import owner_label
from memest.reporters.recommend import estimator_note, estimator_words
from memest.reporters.views import (
    model_name,
    phase_words,
    short_paths,
    sized_by_words,
    sizing_words,
)
from memest.units import count_cell, gib_cell, ratio_cell

templates = Jinja2Templates(directory=str(resources.files("memest.service") / "templates"))


def _gib(value: int | None, digits: int = 3) -> str:
    return gib_cell(value, digits)


def _sgib(value: int | None) -> str:
    return gib_cell(value, signed=True)


def _when(value: datetime | None) -> str:
    """A time as pages show it: UTC, with its zone (a naive time is stored UTC)."""
    if value is None:
        return ""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


_BREAK_AFTER = re.compile(r"([_.+/-])")


def _wbr(text: object) -> Markup:
    """``text`` escaped, with a line-break opportunity after each _ . + / - (run ids and build
    labels wrap at their parts, never inside a word, and copy as they are)."""
    return Markup(_BREAK_AFTER.sub(r"\1<wbr>", str(escape(text))))


templates.env.filters.update(
    wbr=_wbr,
    when=_when,
    gib=_gib,
    sgib=_sgib,
    count=count_cell,
    ratio=ratio_cell,
    owner_color=plots.owner_color,
    owner_label=owner_label,
    series_color=plots_history.series_color,
    series_key=plots_history.series_key,
    sized_by_words=sized_by_words,
    phase_words=phase_words,
    model_name=model_name,
    short_paths=short_paths,
    sizing_words=sizing_words,
    estimator_words=estimator_words,
    estimator_note=estimator_note,
)


@pass_context
def _url_path(context: dict[str, Any], name: str, /, **params: Any) -> str:
    """The path of route ``name``, never an absolute URL: the Host header must not reach a page
    (cache poisoning). Each parameter is percent-encoded, "/" included, so that a model named
    ``org/m#v2`` or ``org/m%41`` links to itself."""
    request: Request = context["request"]
    quoted = {key: quote(str(value), safe="") for key, value in params.items()}
    path: str = request.app.url_path_for(name, **quoted)
    return str(request.scope.get("root_path", "")) + path


templates.env.globals["url_for"] = _url_path


def compile_templates() -> None:
    """Compile every page template now, at startup: a first view would otherwise spend about
    half a second compiling (kept by Jinja's template cache afterwards)."""
    for name in templates.env.list_templates(extensions=["html"]):
        templates.env.get_template(name)


HTML_PAGE: dict[int | str, dict[str, Any]] = {
    200: {"description": "HTML page", "content": {"text/html": {"example": "<!doctype html>"}}}
}
