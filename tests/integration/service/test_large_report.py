"""A valid report of 4,000 capture stages and 4,000 trigger rows: every read route answers, each
in time linear in the report (the times are printed, never asserted: CI machines vary)."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

from fastapi.testclient import TestClient

from memest.demo import demo_report
from memest.units import MiB
from tests.integration.service.conftest import AUTH

STAGES = 4000


def _large_report() -> dict[str, object]:
    data: dict[str, object] = json.loads(
        demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json()
    )
    data.update(source="synthetic", report_id="large-r0", run_id="large")
    bd = data["breakdown"]
    assert isinstance(bd, dict)
    # Each stage grew 4 MiB; one trigger row per stage claims 1 MiB for its own owner.
    bd["stages"] = [{"stage": f"s{i}", "pool_growth_bytes": 4 * MiB} for i in range(STAGES)]
    bd["triggers"] = [
        {"stage": f"s{i}", "owner": f"owner{i}", "bytes": 1 * MiB} for i in range(STAGES)
    ]
    bd["graph_pool_growth_bytes"] = STAGES * 4 * MiB
    return data


def test_every_route_reads_a_report_of_4000_stages_and_4000_triggers(client: TestClient) -> None:
    data = _large_report()
    posted = client.post(
        "/api/v1/reports",
        content=json.dumps(data),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert posted.status_code == 201, posted.text
    model = quote(str(data["model"]), safe="")
    routes = [
        "/api/v1/runs/large",
        "/api/v1/runs/large/breakdown",
        "/api/v1/runs/large/ranks/0",
        "/metrics",
        f"/models/{model}",
        f"/models/{model}?run=large",
        "/",
    ]
    answers = {}
    for route in routes:
        start = time.perf_counter()
        answer = client.get(route)
        print(f"GET {route}: {time.perf_counter() - start:.3f} s, {len(answer.content)} bytes")
        assert answer.status_code == 200, (route, answer.text[:200])
        answers[route] = answer
    stages = answers["/api/v1/runs/large/breakdown"].json()["stages"]
    assert len(stages) == STAGES
    # Stage s7: owner7's 1 MiB, then 3 MiB no row claims.
    assert [(o["owner"], o["bytes"]) for o in stages[7]["owners"]] == [
        ("unattributed:remainder", 3 * MiB),
        ("owner7", 1 * MiB),
    ]
    assert 'owner="owner3999",stage="s3999"' in answers["/metrics"].text
