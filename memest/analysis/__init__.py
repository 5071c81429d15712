"""memest.analysis: allocator snapshot → stage / owner breakdown (pure Python, no torch).

Usage::

    from memest.analysis import analyze, OwnerRules
    from memest.snapshot import load_snapshot

    breakdown = analyze(load_snapshot("snap.json"), phases, OwnerRules.default())

Names are imported on first use, so importing one submodule (the vLLM plugin imports
``memest.analysis.inductor``) does not import the rest. The stage tag lives in
``memest.snapshot.tags``: snapshots carry it, the analysis reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memest.lazy import lazy_attributes

if TYPE_CHECKING:
    from memest.analysis.owners import OwnerRule, OwnerRules
    from memest.analysis.replay import NO_STAGE, analyze, summarize_owners

_SOURCES: dict[str, str] = {
    "OwnerRule": "memest.analysis.owners",
    "OwnerRules": "memest.analysis.owners",
    "NO_STAGE": "memest.analysis.replay",
    "analyze": "memest.analysis.replay",
    "summarize_owners": "memest.analysis.replay",
}

__all__ = [
    "NO_STAGE",
    "OwnerRule",
    "OwnerRules",
    "analyze",
    "summarize_owners",
]


__getattr__ = lazy_attributes(__name__, _SOURCES, globals())
