"""The one KV-cache recommendation for a start, as every surface states it."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from memest.reporters.views import readable_note
from memest.schema import EstimateRecord, StartAccounting
from memest.units import fmt_gib, kv_cache_memory_flag

#: The estimator records a recommendation is taken from, in order of preference: the startup
#: plan the plugin wrote after this start (this start's measured end state; a start given the
#: flag skips graph-memory profiling, as a plan start does), else memest's budget in this start.
RECOMMENDING = ("memest-plan", "memest")


def recommendation_record(accounting: StartAccounting) -> EstimateRecord | None:
    """The estimator record the recommendation comes from (RECOMMENDING); None when the report
    has no memest budget (a start memest cannot recompute gets no recommendation)."""
    memest = accounting.estimator("memest")
    if memest is None or not memest.kv_cache_bytes:
        return None
    plan = accounting.estimator("memest-plan")
    return plan if plan is not None and plan.kv_cache_bytes else memest


def recommended_kv_cache_bytes(accounting: StartAccounting) -> int | None:
    """The bytes of `--kv-cache-memory-bytes` memest recommends for the start's configuration;
    None when the report has no memest budget."""
    record = recommendation_record(accounting)
    return record.kv_cache_bytes if record is not None else None


def kv_cache_flag(accounting: StartAccounting) -> str | None:
    """The vLLM flag of the recommendation, as every surface prints it."""
    value = recommended_kv_cache_bytes(accounting)
    return kv_cache_memory_flag(value) if value else None


#: Each estimator record as an operator names it (pages and tables).
ESTIMATOR_WORDS = {
    "vllm": "vLLM's own estimate",
    "memest": "memest's budget",
    "memest-plan": "startup plan for the next start",
    "measured": "this start, as measured",
    "published": "published figures",
}


def estimator_words(name: str) -> str:
    """An estimator record's name as an operator reads it."""
    return ESTIMATOR_WORDS.get(name, name)


class Recommendation(BaseModel):
    """The one flag a page recommends, where it comes from, and the other KV figures in words."""

    flag: str
    kv_cache_bytes: int
    estimator: str = Field(description="The record it comes from (RECOMMENDING)")
    why: str
    others: list[str] = Field(default_factory=list)


def recommendation(accounting: StartAccounting) -> Recommendation | None:
    """The page's recommendation and why the other estimators' KV figures differ from it."""
    record = recommendation_record(accounting)
    if record is None or not record.kv_cache_bytes:
        return None
    value = record.kv_cache_bytes
    if record.estimator == "memest-plan":
        why = (
            "the startup plan the plugin wrote after this start: this start's KV cache "
            "corrected by what it ended over or under its budget, plus what vLLM's "
            "graph-memory profiling left allocated here (a start given the flag skips it)"
        )
    else:
        why = "memest's full-initialization budget in this start"
    others = []
    for other in accounting.estimators:
        if other.estimator in (record.estimator, "measured") or not other.kv_cache_bytes:
            continue
        delta = other.kv_cache_bytes - value
        others.append(
            f"{estimator_words(other.estimator)} gives {fmt_gib(other.kv_cache_bytes)} GiB "
            f"({fmt_gib(delta, signed=True)} GiB){_over_budget(other)}"
        )
    return Recommendation(
        flag=kv_cache_memory_flag(value),
        kv_cache_bytes=value,
        estimator=record.estimator,
        why=why,
        others=others,
    )


def _over_budget(record: EstimateRecord) -> str:
    over = record.usage_minus_budget_bytes
    if over is None or over <= 0:
        return ""
    return f", which would have ended {fmt_gib(over)} GiB over the budget"


#: The flag and plan file a plugin's startup-plan note starts with: the page states the flag once.
_PLAN_FLAG = re.compile(r"^--kv-cache-memory-bytes[ =]\d+ \(startup plan [^)]*\);?\s*")


def estimator_note(record: EstimateRecord) -> str:
    """A record's note as a page's estimates table shows it (no second flag, figures in GiB)."""
    return readable_note(_PLAN_FLAG.sub("", record.note))
