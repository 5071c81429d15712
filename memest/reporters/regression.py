"""What a regression is, for every surface that flags one (`memest check`, /metrics' labels,
the service's pages): the start's mode, the direction that is bad, and the run-to-run noise.

A start's mode says who sized its KV cache: ``measure`` (vLLM's own budget, memest watching),
``apply`` (memest's budget) or ``plan`` (a fixed KV size from a startup plan). Two starts are
comparable only within one mode: an apply start holds less KV than an enable start of the same
configuration by design, not by regression.
"""

from __future__ import annotations

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
    return MODES.get(accounting.kv_sized_by or "vllm", "measure")
