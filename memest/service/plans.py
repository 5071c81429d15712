"""Capture plans over HTTP: a thin adapter over memest.plan (no plan arithmetic here)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from memest.errors import ConfigError
from memest.schema import CapturePlan

_RESOLVER_NAMES = ("resolve_plan", "capture_plan", "build_plan", "make_plan")


def plan_resolver() -> Callable[..., CapturePlan] | None:
    """memest.plan's resolver, or None while memest.plan does not provide one."""
    try:
        module = importlib.import_module("memest.plan")
    except ImportError:
        return None
    for name in _RESOLVER_NAMES:
        fn = getattr(module, name, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return None


def resolve_plan(**kwargs: Any) -> CapturePlan:
    """Resolve a CapturePlan through memest.plan.

    Raises:
        LookupError: memest.plan has no resolver (the service answers 503).
        ConfigError: memest.plan rejected an argument (the service answers 422 naming it).
    """
    fn = plan_resolver()
    if fn is None:
        raise LookupError(
            "memest.plan provides no plan resolver (looked for " + ", ".join(_RESOLVER_NAMES) + ")"
        )
    plan = fn(**{k: v for k, v in kwargs.items() if v is not None})
    if not isinstance(plan, CapturePlan):
        raise LookupError(f"memest.plan returned {type(plan).__name__}, not CapturePlan")
    return plan


def resolve_plan_or_none(**kwargs: Any) -> CapturePlan | None:
    """Like resolve_plan, but None when memest.plan cannot resolve this configuration."""
    try:
        return resolve_plan(**kwargs)
    except (LookupError, ConfigError, TypeError):
        return None
