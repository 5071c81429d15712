"""Estimates over HTTP: a thin adapter over memest.estimate (no estimator arithmetic here)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from memest.schema import EstimateComparison, RunReport


def _estimate_attr(name: str) -> Callable[..., Any] | None:
    try:
        module = importlib.import_module("memest.estimate")
    except ImportError:
        return None
    fn = getattr(module, name, None)
    return fn if callable(fn) else None


def estimate_available() -> str | None:
    """None when memest.estimate.compare exists, else the reason it cannot be used."""
    if _estimate_attr("compare") is None:
        return "memest.estimate.compare is not available"
    return None


def compare_report(report: RunReport) -> EstimateComparison:
    """memest.estimate.compare(report).

    Raises:
        LookupError: memest.estimate has no ``compare`` (the service answers 503).
    """
    fn = _estimate_attr("compare")
    if fn is None:
        raise LookupError("memest.estimate.compare is not available")
    result = fn(report)
    if not isinstance(result, EstimateComparison):
        raise LookupError(f"memest.estimate.compare returned {type(result).__name__}")
    return result


def what_if(report: RunReport, plan: Any) -> Any:
    """memest.estimate.what_if(report, plan): predicted owners and KV budget under another grid.

    Raises:
        LookupError: memest.estimate has no ``what_if`` (the service answers 503).
    """
    fn = _estimate_attr("what_if")
    if fn is None:
        raise LookupError("memest.estimate.what_if is not available")
    return fn(report, plan)
