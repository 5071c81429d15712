"""A valid report of 4,000 capture stages and 4,000 trigger rows: every read route answers, each
in time linear in the report (the times are printed, never asserted: CI machines vary), with
its stage bars bounded (the rest summed as "other")."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

from fastapi.testclient import TestClient

from memest.demo import demo_report
from memest.service.metrics import STAGES_PER_RUN
from memest.service.routers.dashboard import PAGE_STAGES
from memest.service.schemas import API_OWNERS_PER_STAGE, API_STAGES
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
        "/metrics?detail=true",
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
    # Bounded: the API's stage bars are the API_STAGES of most growth (all 4 MiB: the first ones,
    # in order), then one "other" stage of the rest; the model page shows fewer.
    for route in ("/api/v1/runs/large/breakdown", "/api/v1/runs/large"):
        stages = answers[route].json()["stages"]
        assert len(stages) == API_STAGES
        assert [s["stage"] for s in stages[:3]] == ["s0", "s1", "s2"]
        other = stages[-1]
        folded = STAGES - (API_STAGES - 1)
        assert (other["stage"], other["pool_growth_bytes"]) == ("other", folded * 4 * MiB)
        assert len(other["owners"]) == API_OWNERS_PER_STAGE
        assert sum(o["bytes"] for o in other["owners"]) == folded * 4 * MiB
    # Stage s7: owner7's 1 MiB, then 3 MiB no row claims.
    assert [(o["owner"], o["bytes"]) for o in stages[7]["owners"]] == [
        ("unattributed:remainder", 3 * MiB),
        ("owner7", 1 * MiB),
    ]
    # The breakdown's own rows are returned whole.
    breakdown = answers["/api/v1/runs/large/breakdown"].json()["breakdown"]
    assert len(breakdown["stages"]) == STAGES
    page = answers[f"/models/{model}"].text
    assert f"{STAGES - (PAGE_STAGES - 1)} more stages" in page
    assert len(page) < 1_000_000
    # /metrics: STAGES_PER_RUN stages per run, the last one "other" holding the rest's bytes.
    pool = [
        ln
        for ln in answers["/metrics?detail=true"].text.splitlines()
        if ln.startswith("memest_graph_pool_bytes{")
    ]
    assert len({ln.split('stage="', 1)[1].split('"', 1)[0] for ln in pool}) == STAGES_PER_RUN
    in_other = [float(ln.rsplit(" ", 1)[1]) for ln in pool if 'stage="other"' in ln]
    assert sum(in_other) == (STAGES - (STAGES_PER_RUN - 1)) * 4 * MiB
    assert any(
        'owner_id="owner3"' in ln and 'stage="s3"' in ln
        for ln in answers["/metrics?detail=true"].text.splitlines()
    )
