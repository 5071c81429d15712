"""OpenAPI examples, built from the published demo reports so that they are real figures."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from memest.analysis.ranks import rank_check
from memest.analysis.stages import stage_bars
from memest.demo import demo_reports
from memest.estimate import account
from memest.reporters.views import compare, history, run_facts, runner_counts

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
    "estimate": REPORT["estimate"],
    "computed_estimate": None,
    "computed_estimate_unavailable": "memest.estimate.compare is not available",
    "rank_check": RANK_CHECK,
    "ranks": [{"rank": 0, "report_id": CHANGE.report_id, "facts": FACTS}],
    "notes": REPORT["notes"],
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
