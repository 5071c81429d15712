"""Full-initialization KV budget, vLLM's own estimate beside it, startup plans and what-ifs.

Pure Python: reads RunReports (memest.schema), never imports torch.
"""

from memest.estimate.accounting import BudgetSplit, account, budget_splits, gpu_parts
from memest.estimate.compare import compare, record, usage_bytes
from memest.estimate.kv import kv_bytes_per_token, kv_page_bytes, kv_tokens
from memest.estimate.phases import (
    check_report,
    full_init_kv_budget,
    full_init_terms,
    non_kv_bytes,
    requested_bytes,
)
from memest.estimate.startup_plan import (
    PLAN_SCHEMA_VERSION,
    startup_plan_dir,
    startup_plan_document,
    startup_plan_filename,
    write_startup_plan,
)
from memest.estimate.vllm_estimate import extrapolate_full_graph_memory, vllm_cudagraph_estimate
from memest.estimate.whatif import law_for, pool_predictions, resolve_grid, what_if
from memest.schema import FullInitTerms

__all__ = [
    "PLAN_SCHEMA_VERSION",
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
