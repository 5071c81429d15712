"""What a regression is, for every surface that flags one (`memest check`, /metrics' labels,
the service's pages): the start's mode, the direction that is bad, and the run-to-run noise.

A start's mode says who sized its KV cache: ``measure`` (vLLM's own budget, memest watching),
``apply`` (memest's budget) or ``plan`` (a fixed KV size from a startup plan). Two starts are
comparable only within one mode: an apply start holds less KV than an enable start of the same
configuration by design, not by regression.
"""

from __future__ import annotations

from memest.builds.history import KV_DROP_FRACTION, POOL_GROWTH_FRACTION
from memest.schema import StartAccounting

#: kv_sized_by -> mode; a report that does not say who sized it ran vLLM's own budget.
MODES = {"vllm": "measure", "memest": "apply", "memest-plan": "plan"}
#: The sized_by label of a report that does not say.
SIZED_BY_UNKNOWN = "unknown"


def sized_by(accounting: StartAccounting) -> str:
    """Who sized the start's KV cache, as a label ('unknown' when the report does not say)."""
    return accounting.kv_sized_by or SIZED_BY_UNKNOWN


def start_mode(accounting: StartAccounting) -> str:
    """measure / apply / plan: the mode of the start (see the module's docstring)."""
    return mode_of(accounting.kv_sized_by)


#: Run-to-run spread of repeated starts of one configuration, in bytes and tokens: reports/vllm
#: holds six starts of S_llama8b_s128_t4096 in call 20 (vLLM alone and memest measuring,
#: alternating) and three of A in call 16; every one has the same KV tokens, KV bytes, non-KV
#: bytes, graph pool and usage minus budget, to the byte (reports/vllm/validation.json). A change
#: larger than this spread is the build's, not the GPU's.
RUN_TO_RUN_SPREAD = 0

#: What the figures of a start look like when worse: less KV, more of everything else.
LOWER_IS_WORSE = frozenset({"kv_tokens", "kv_cache_bytes"})


def verdict(figure: str, before: int, after: int, threshold: float) -> str:
    """'regression' (worse by more than ``threshold``, a fraction of ``before``), 'worse'
    (worse, within the threshold), 'noise' (within the run-to-run spread), 'better'."""
    change = after - before
    if abs(change) <= RUN_TO_RUN_SPREAD:
        return "noise"
    worse = change < 0 if figure in LOWER_IS_WORSE else change > 0
    if not worse:
        return "better"
    return "regression" if abs(change) > threshold * abs(before) else "worse"


#: Figure -> the threshold it is judged by on the pages (a fraction of the baseline's figure):
#: the history's policy (memest.builds.history), so a page and the history flag the same change.
PAGE_THRESHOLDS = {
    "kv_tokens": KV_DROP_FRACTION,
    "kv_cache_bytes": KV_DROP_FRACTION,
    "graph_pool_bytes": POOL_GROWTH_FRACTION,
    "non_kv_bytes": POOL_GROWTH_FRACTION,
}

#: How each verdict reads on a page.
VERDICT_WORDS = {
    "regression": "regression",
    "worse": "worse, within the threshold",
    "noise": "same (within run-to-run noise)",
    "better": "better",
    "other_mode": "not judged: another estimator sized the KV cache",
}

#: The KV figures, which an estimator sizes: two starts of different modes differ by design.
KV_FIGURES = frozenset({"kv_tokens", "kv_cache_bytes"})


def mode_of(kv_sized_by: str | None) -> str:
    """The mode of a start whose KV cache ``kv_sized_by`` sized (see :func:`start_mode`)."""
    return MODES.get(kv_sized_by or "vllm", "measure")


def page_verdict(figure: str, before: int | None, after: int | None) -> str | None:
    """The verdict of a change of ``figure`` from ``before`` to ``after`` with its page
    threshold (None when either figure is missing)."""
    if before is None or after is None:
        return None
    return verdict(figure, before, after, PAGE_THRESHOLDS[figure])
