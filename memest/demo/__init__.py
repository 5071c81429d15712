"""Demo reports built from the seed's published GB200 figures (source="published").

Two deployments, each on main and on the change, rank 0 of a TP4 start:

- DeepSeek-V4-Flash with DSpark K=7 (TP4 + EP, 1M context, 4096-token decode budget);
- MiniMax-M3 with EAGLE3 K=3 (TP4).

The figures come from the seed's tables "Actual added GPU memory", "Budget and resulting KV
capacity", the trigger tables of its sections 1-3, "Measured graph counts, capture-stage memory"
and "Memory-estimator TODO across models". They are published numbers (GiB with three decimals),
not a measurement made by memest: only rank 0 was published, so the other ranks are absent.

Usage::

    from memest.demo import demo_reports
    for report in demo_reports():
        ...
"""

from __future__ import annotations

from memest.demo._published import (
    DEMO_BUILDS,
    DEMO_MODELS,
    PUBLISHED_AT,
    SEED_DOCUMENT,
    demo_report,
    demo_reports,
)

__all__ = [
    "DEMO_BUILDS",
    "DEMO_MODELS",
    "PUBLISHED_AT",
    "SEED_DOCUMENT",
    "demo_report",
    "demo_reports",
]
