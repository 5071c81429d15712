"""Golden answers of the service's what-if routes (POST /api/v1/runs/{id}/estimate, POST
/api/v1/what-if) and of POST /api/v1/preflight, refusals included: each answer's status and
body, byte for byte as tests/data/golden/service/ holds them. They detect a change, not the
truth of a figure (tests/golden.py says how a change is regenerated with its reason)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.golden import check

from .conftest import AUTH  # noqa: TID252

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "tests/data/starts"
A = RAW / "call11.A_llama8b_s128_t4096.enable-cold.report.rank0.json"
W4 = RAW / "call11.W4_llama8b_s128_t4096_cap64.apply.report.rank0.json"
MLA = RAW / "call12.L_dsv2lite8l_s64_t2048.apply-hist.report.rank0.json"
MODEL = json.loads((ROOT / "examples/llama8b.config.json").read_text())
DRAFTER = json.loads((ROOT / "examples/eagle3_8b.config.json").read_text())
EAGLE3_K3 = {"method": "eagle3", "num_speculative_tokens": 3}

#: name -> (report, request body) of POST /api/v1/runs/{id}/estimate.
RUN_ESTIMATES: dict[str, tuple[Path, dict[str, Any]]] = {
    "W1": (A, {"grid": {"max_num_seqs": 32}}),
    "W2-utilization": (
        A,
        {"grid": {"max_num_batched_tokens": 8192}, "gpu_memory_utilization": 0.9},
    ),
    "W3": (A, {"grid": {"speculative_config": EAGLE3_K3}, "drafter_dims": DRAFTER}),
    "W4-model-dims": (
        A,
        {"grid": {"compilation_config": {"max_cudagraph_capture_size": 64}}, "model_dims": MODEL},
    ),
    "own-grid-concurrency": (A, {"concurrency": 100}),
    "kv-tokens": (A, {"grid": {"max_num_seqs": 64}, "kv_tokens": 300000}),
    "mla": (MLA, {"grid": {"max_model_len": 2048}}),
    "refused-unknown-field": (A, {"grid": {"max_num_sequences": 3}}),
    "refused-bad-value": (A, {"grid": {"max_num_seqs": 0}}),
    "refused-both-utilizations": (
        A,
        {"grid": {"gpu_memory_utilization": 0.8}, "gpu_memory_utilization": 0.9},
    ),
    "refused-both-questions": (A, {"kv_tokens": 10, "concurrency": 2}),
    "refused-does-not-fit": (A, {"grid": {"gpu_memory_utilization": 0.05}}),
    "drafter-dims-alone": (W4, {"drafter_dims": DRAFTER}),
    "refused-request-field": (A, {"grids": {}}),
    "refused-model-dims": (A, {"model_dims": {"hidden_size": 4096}}),
}

PREFLIGHTS: dict[str, dict[str, Any]] = {
    "llama8b": {"model_config": MODEL, "gpu": "h200", "max_num_seqs": 128},
    "llama8b-eagle3": {
        "model_config": MODEL,
        "gpu": "h200",
        "speculative_config": EAGLE3_K3,
        "draft_model_config": DRAFTER,
    },
    "refused-seqs": {"model_config": MODEL, "gpu": "h200", "max_num_seqs": 0},
    "refused-gpu": {"model_config": MODEL, "gpu": "a100"},
    "refused-does-not-fit": {"model_config": MODEL, "gpu": "h200", "gpu_memory_utilization": 0.05},
}


def _answer(r: Any) -> str:
    return f"{r.status_code}\n{json.dumps(r.json(), indent=1, sort_keys=True)}\n"


def _store(client: TestClient, report: Path) -> str:
    body = report.read_bytes()
    r = client.post(
        "/api/v1/reports", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code in (200, 201), r.text
    return str(json.loads(body)["run_id"])


def test_run_estimates_are_unchanged(client: TestClient) -> None:
    stored: dict[Path, str] = {}
    for name, (report, body) in sorted(RUN_ESTIMATES.items()):
        if report not in stored:
            stored[report] = _store(client, report)
        r = client.post(f"/api/v1/runs/{stored[report]}/estimate", json=body)
        check(f"service/run-estimate-{name}.txt", _answer(r))


def test_what_if_route_is_unchanged(client: TestClient) -> None:
    report = json.loads(A.read_text())
    plan = json.loads(W4.read_text())["capture_plans"][0]
    r = client.post("/api/v1/what-if", json={"report": report, "plan": plan})
    check("service/what-if-W4-plan.txt", _answer(r))
    bad = {**plan, "total_graphs": plan["total_graphs"] + 1}
    r = client.post("/api/v1/what-if", json={"report": report, "plan": bad})
    check("service/what-if-refused-total.txt", _answer(r))
    r = client.post("/api/v1/what-if", json={"report": report})
    check("service/what-if-refused-no-plan.txt", _answer(r))


def test_preflights_are_unchanged(client: TestClient) -> None:
    for name, body in sorted(PREFLIGHTS.items()):
        r = client.post("/api/v1/preflight", json=body)
        check(f"service/preflight-{name}.txt", _answer(r))
