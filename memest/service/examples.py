"""OpenAPI examples, built from the published demo reports so that they are real figures."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from memest.analysis.ranks import rank_check
from memest.analysis.stages import stage_bars
from memest.builds.history import history
from memest.builds.runs import run_facts, runner_counts
from memest.demo import demo_reports
from memest.estimate import account
from memest.preflight import preflight
from memest.reporters.views import compare, notes
from memest.schema.preflight import PreflightRequest

_DEMO = demo_reports()
MAIN, CHANGE = _DEMO[0], _DEMO[1]


def dump(model: BaseModel) -> Any:
    return json.loads(model.model_dump_json())


def json_example(value: Any, description: str = "Successful Response") -> dict[int | str, Any]:
    """A ``responses`` entry with one JSON example for status 200."""
    return {200: {"description": description, "content": {"application/json": {"example": value}}}}


REPORT = dump(CHANGE)
COMPARISON = dump(compare(MAIN, CHANGE))
HISTORY = dump(history(MAIN.model, [MAIN, CHANGE]))
STAGES = [dump(b) for b in stage_bars(CHANGE)]
RUNNERS = [dump(r) for r in runner_counts(CHANGE)]
FACTS = dump(run_facts(CHANGE))
RANK_CHECK = dump(rank_check([CHANGE]))
RUN_SUMMARY = {
    "run_id": CHANGE.run_id,
    "model": CHANGE.model,
    "build": CHANGE.build.label,
    "commit": CHANGE.build.vllm_commit,
    "vllm_version": None,
    "gpu": CHANGE.gpu.name if CHANGE.gpu else None,
    "source": CHANGE.source,
    "world_size": CHANGE.world_size,
    "created_at": CHANGE.created_at.isoformat(),
    "ranks": [0],
}
RUN_DETAIL = {
    "run": RUN_SUMMARY,
    "lead_rank": 0,
    "accounting": dump(account(CHANGE)),
    "facts": FACTS,
    "phases": REPORT["breakdown"]["phases"],
    "stages": STAGES,
    "runners": RUNNERS,
    "capture_plans": REPORT["capture_plans"],
    "live_peaks": REPORT["breakdown"]["live_peaks"],
    "retained": REPORT["breakdown"]["retained"],
    "stored_estimate": REPORT["estimate"],
    "stored_estimate_status": "superseded by accounting",
    "computed_estimate": None,
    "computed_estimate_unavailable": "memest.estimate.compare is not available",
    "rank_check": RANK_CHECK,
    "ranks": [{"rank": 0, "report_id": CHANGE.report_id, "facts": FACTS}],
    "notes": notes(CHANGE).main,
    "diagnostics": notes(CHANGE).diagnostics,
    "hook_errors": [],
}
BREAKDOWN = {
    "run_id": CHANGE.run_id,
    "rank": 0,
    "model": CHANGE.model,
    "build": CHANGE.build.label,
    "breakdown": REPORT["breakdown"],
    "stages": STAGES,
}
MODELS = {
    "data": [
        {
            "model": MAIN.model,
            "runs": 2,
            "builds": ["main", "PR"],
            "latest_run_id": CHANGE.run_id,
            "latest_created_at": CHANGE.created_at.isoformat(),
        }
    ],
    "count": 1,
}
ESTIMATE = REPORT["estimate"]
ERROR_422 = {"detail": "invalid RunReport: config: Field required", "field": "config"}

#: The shape of a what-if answer. The demo reports carry no phase readings, so no real prediction
#: can be made from them; the figures here only show the fields.
WHAT_IF = {
    "grid_from": "vllm-0.33.0, gb200, eagle3 K=3",
    "grid_to": "seed, gb200, eagle3 K=3",
    "owners": [
        {
            "stage": "target.piecewise",
            "owner": "aux_hidden_states",
            "law": "graph_count",
            "measured_bytes": 1314259206,
            "factor": 0.47,
            "predicted_bytes": 617701827,
            "note": "",
        }
    ],
    "by_owner_bytes": {"aux_hidden_states": 617701827},
    "measured_by_owner_bytes": {"aux_hidden_states": 1314259206},
    "graph_pool_bytes_from": 1314259206,
    "graph_pool_bytes_to": 617701827,
    "kv_budget_bytes_from": None,
    "kv_budget_bytes_to": None,
    "kv_tokens_from": None,
    "kv_tokens_to": None,
    "dominant_owner": "aux_hidden_states",
    "dominant_change_bytes": -696557379,
    "notes": ["Example of the response shape; these figures are not a prediction."],
}

# POST /api/v1/runs/{run_id}/estimate on the H200 start reports/vllm/raw/call9.S_llama8b_s128_t4096
# (what_if trimmed to its headline fields).
RUN_ESTIMATE_REQUEST = {
    "grid": {"max_num_seqs": 32, "max_num_batched_tokens": 2048},
    "concurrency": 200,
    "model_dims": {"hidden_size": 4096, "vocab_size": 128256, "torch_dtype": "bfloat16"},
}
RUN_ESTIMATE = {
    "run_id": "S_llama8b_s128_t4096.apply.1796123281",
    "rank": 0,
    "what_if": {
        "grid_from": "max_num_seqs 128, max_num_batched_tokens 4096, max_model_len 4096: "
        "target PIECEWISE: 35 graphs up to 256 tokens; target FULL: 19 graphs up to 128 tokens",
        "grid_to": "max_num_seqs 32, max_num_batched_tokens 2048, max_model_len 4096: "
        "target PIECEWISE: 11 graphs up to 64 tokens; target FULL: 7 graphs up to 32 tokens",
        "graph_pool_bytes_from": 65011712,
        "graph_pool_bytes_to": 25165824,
        "kv_budget_bytes_from": 109614686208,
        "kv_budget_bytes_to": 110191161003,
        "kv_tokens_from": 836288,
        "kv_tokens_to": 840688,
        "kv_bytes_per_token_from": 131072,
        "kv_bytes_per_token_to": 131072,
        "max_model_len_from": 4096,
        "max_model_len_to": 4096,
        "concurrency_from": 204.171875,
        "concurrency_to": 205.24609375,
        "term_laws": {
            "graph_pool_bytes": "per-owner pool laws; synthetic request trace: target.piecewise, "
            "target.full",
            "outside_torch_bytes": "graph objects (graph profiling and capture) scale with the "
            "graph count x the layers each graph holds",
            "runner_buffer_bytes": "runner buffers f(G') - f(G): block_tables",
            "baseline_torch_bytes": "runner buffers f(G') - f(G): input_buffers, request_state",
            "weights_bytes": "runner buffers f(G') - f(G): penalties, structured_outputs",
            "profiling_residue_bytes": "runner buffers f(G') - f(G): topk_topp_buffer",
            "profile_peak_activation_bytes": "max_num_batched_tokens",
        },
    },
    "terms": [
        {
            "term": "requested_bytes",
            "bytes_from": 127593398272,
            "bytes_to": 127593398272,
            "law": "constant",
        },
        {
            "term": "baseline_torch_bytes",
            "bytes_from": 35651584,
            "bytes_to": 35623936,
            "law": "runner buffers f(G') - f(G): input_buffers, request_state",
        },
        {
            "term": "weights_bytes",
            "bytes_from": 16136193536,
            "bytes_to": 16083865088,
            "law": "runner buffers f(G') - f(G): penalties, structured_outputs",
        },
        {
            "term": "profile_peak_activation_bytes",
            "bytes_from": 620756992,
            "bytes_to": 310378496,
            "law": "max_num_batched_tokens",
        },
        {
            "term": "outside_torch_bytes",
            "bytes_from": 980221952,
            "bytes_to": 855790933,
            "law": "graph objects (graph profiling and capture) scale with the graph count x the "
            "layers each graph holds",
        },
        {
            "term": "graph_pool_bytes",
            "bytes_from": 65011712,
            "bytes_to": 25165824,
            "law": "per-owner pool laws; synthetic request trace: target.piecewise, target.full",
        },
        {
            "term": "runner_buffer_bytes",
            "bytes_from": 39912448,
            "bytes_to": 39699456,
            "law": "runner buffers f(G') - f(G): block_tables",
        },
        {
            "term": "profiling_residue_bytes",
            "bytes_from": 100963840,
            "bytes_to": 51713536,
            "law": "runner buffers f(G') - f(G): topk_topp_buffer",
        },
        {"term": "margin_bytes", "bytes_from": 0, "bytes_to": 0, "law": "constant"},
    ],
    "kv_cache_memory_bytes_to": 110191161003,
    "concurrency_from": 204.171875,
    "concurrency_to": 205.24609375,
    "inverse": {
        "kv_tokens": 819200,
        "gpu_memory_utilization": 0.8313,
        "largest_max_num_seqs": 2048,
        "max_num_seqs_ceiling": 2048,
        "max_num_seqs_ceiling_by": "max_num_batched_tokens",
    },
}

_LLAMA8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
PREFLIGHT_REQUEST = {
    "model_config": _LLAMA8B_CONFIG,
    "gpu": "h200",
    "max_num_seqs": 128,
    "max_num_batched_tokens": 4096,
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.85,
}
PREFLIGHT = dump(preflight(PreflightRequest.model_validate(PREFLIGHT_REQUEST)))
