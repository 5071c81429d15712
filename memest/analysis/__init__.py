"""memest.analysis: allocator snapshot → stage / owner breakdown (pure Python, no torch).

Usage::

    from memest.analysis import analyze, OwnerRules
    from memest.snapshot import load_snapshot

    breakdown = analyze(load_snapshot("snap.json"), phases, OwnerRules.default())
"""

from memest.analysis.owners import OwnerRule, OwnerRules
from memest.analysis.replay import NO_STAGE, analyze, summarize_owners
from memest.analysis.tags import DEFAULT_POOL, StageTag, format_tag, parse_tag, pool_key

__all__ = [
    "DEFAULT_POOL",
    "NO_STAGE",
    "OwnerRule",
    "OwnerRules",
    "StageTag",
    "analyze",
    "format_tag",
    "parse_tag",
    "pool_key",
    "summarize_owners",
]
