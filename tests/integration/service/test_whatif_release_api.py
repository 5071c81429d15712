"""The service's what-if routes take the release G' runs, as `memest estimate --vllm-version`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.service.conftest import AUTH, MakeClient

START = (
    Path(__file__).parents[2]
    / "data"
    / "starts"
    / "call11.W1_llama8b_s32_t4096.apply.report.rank0.json"
)


def test_run_estimate_and_what_if_take_the_release(make_client: MakeClient) -> None:
    raw = json.loads(START.read_text())
    client = make_client()
    assert client.post("/api/v1/reports", json=raw, headers=AUTH).status_code == 201
    route = f"/api/v1/runs/{raw['run_id']}/estimate"
    body = {"grid": {"max_num_seqs": 64}}
    new = client.post(route, json={**body, "vllm_version": "0.34.0"})
    assert new.status_code == 200, new.text
    w = new.json()["what_if"]
    assert w["vllm_version_to"] == "0.34.0" and w["growable_kv_to"] is not None
    assert w["kv_tokens_to"] % 64 == 0
    old = client.post(route, json={**body, "vllm_version": "0.33.0"}).json()["what_if"]
    assert (old["vllm_version_to"], old["growable_kv_to"]) == ("0.33.0", None)

    refused = client.post(route, json={**body, "vllm_version": "0.35.0"})
    assert refused.status_code == 422
    assert refused.json()["field"] == "vllm_version"

    plan = raw["capture_plans"][0]
    calc = client.post(
        "/api/v1/what-if", json={"report": raw, "plan": plan, "vllm_version": "0.34.0"}
    )
    assert calc.status_code == 200, calc.text
    assert calc.json()["vllm_version_to"] == "0.34.0"
    bad = client.post("/api/v1/what-if", json={"report": raw, "plan": plan, "vllm_version": "9"})
    assert bad.status_code == 422 and bad.json()["field"] == "vllm_version"
