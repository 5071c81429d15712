"""Full-initialization KV budget, vLLM's own estimate beside it, startup plans and what-ifs.

Pure Python: reads RunReports (memest.schema), never imports torch.

Names are imported on first use, so importing one submodule (the vLLM plugin imports
``memest.estimate.phases``) does not import the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Imported now: ``compare`` is also the name of its submodule, which would shadow a lazy name.
from memest.estimate.compare import compare, record, usage_bytes
from memest.lazy import lazy_attributes

if TYPE_CHECKING:
    from memest.estimate.accounting import BudgetSplit, account, budget_splits, gpu_parts
    from memest.estimate.kv import kv_bytes_per_token, kv_page_bytes, kv_tokens
    from memest.estimate.phases import (
        check_report,
        full_init_kv_budget,
        non_kv_bytes,
        requested_bytes,
    )
    from memest.estimate.startup_plan import (
        PLAN_SCHEMAS,
        startup_plan_dir,
        startup_plan_document,
        startup_plan_filename,
        write_startup_plan,
    )
    from memest.estimate.terms.catalog import full_init_terms
    from memest.estimate.vllm_estimate import extrapolate_full_graph_memory, vllm_cudagraph_estimate
    from memest.estimate.whatif import law_for, pool_predictions, resolve_grid, what_if
    from memest.schema import FullInitTerms

_SOURCES: dict[str, str] = {
    "BudgetSplit": "memest.estimate.accounting",
    "account": "memest.estimate.accounting",
    "budget_splits": "memest.estimate.accounting",
    "gpu_parts": "memest.estimate.accounting",
    "kv_bytes_per_token": "memest.estimate.kv",
    "kv_page_bytes": "memest.estimate.kv",
    "kv_tokens": "memest.estimate.kv",
    "check_report": "memest.estimate.phases",
    "full_init_kv_budget": "memest.estimate.phases",
    "full_init_terms": "memest.estimate.terms.catalog",
    "non_kv_bytes": "memest.estimate.phases",
    "requested_bytes": "memest.estimate.phases",
    "PLAN_SCHEMAS": "memest.estimate.startup_plan",
    "startup_plan_dir": "memest.estimate.startup_plan",
    "startup_plan_document": "memest.estimate.startup_plan",
    "startup_plan_filename": "memest.estimate.startup_plan",
    "write_startup_plan": "memest.estimate.startup_plan",
    "extrapolate_full_graph_memory": "memest.estimate.vllm_estimate",
    "vllm_cudagraph_estimate": "memest.estimate.vllm_estimate",
    "law_for": "memest.estimate.whatif",
    "pool_predictions": "memest.estimate.whatif",
    "resolve_grid": "memest.estimate.whatif",
    "what_if": "memest.estimate.whatif",
    "FullInitTerms": "memest.schema",
}

__all__ = [
    "PLAN_SCHEMAS",
    "FullInitTerms",
    "BudgetSplit",
    "account",
    "budget_splits",
    "gpu_parts",
    "check_report",
    "compare",
    "extrapolate_full_graph_memory",
    "full_init_kv_budget",
    "full_init_terms",
    "kv_bytes_per_token",
    "kv_page_bytes",
    "kv_tokens",
    "law_for",
    "non_kv_bytes",
    "pool_predictions",
    "record",
    "requested_bytes",
    "resolve_grid",
    "startup_plan_dir",
    "startup_plan_document",
    "startup_plan_filename",
    "usage_bytes",
    "vllm_cudagraph_estimate",
    "what_if",
    "write_startup_plan",
]


__getattr__ = lazy_attributes(__name__, _SOURCES, globals())
