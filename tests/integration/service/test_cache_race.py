"""Reads racing a DELETE and a re-post of the same ids never serve the old content afterwards."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from memest.demo import demo_report
from tests.integration.service.conftest import AUTH

HEADERS = {**AUTH, "Content-Type": "application/json"}
ROUNDS = 15


def _report(round_no: int) -> str:
    data: dict[str, Any] = json.loads(demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json())
    data.update(source="synthetic", report_id="race-r0", run_id="race")
    bd = data["breakdown"]
    bd["stages"] = [{"stage": "s", "pool_growth_bytes": 2**20}]
    bd["triggers"] = [{"stage": "s", "owner": f"round{round_no}", "bytes": 2**20}]
    bd["graph_pool_growth_bytes"] = 2**20
    return json.dumps(data)


#: /metrics with the graph-pool series, by owner.
DETAIL = "/metrics?detail=true"


def _owners(answer: httpx.Response) -> list[str]:
    return [o["owner"] for bar in answer.json()["stages"] for o in bar["owners"]]


def test_a_read_after_a_repost_serves_the_new_content(live_server: str) -> None:
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(base_url=live_server, timeout=30) as reader:
            while not stop.is_set():
                for path in ("/api/v1/runs/race", "/api/v1/runs/race/breakdown", DETAIL):
                    reader.get(path)

    readers = [threading.Thread(target=hammer) for _ in range(3)]
    for t in readers:
        t.start()
    stale = []
    try:
        with httpx.Client(base_url=live_server, timeout=30) as writer:
            for n in range(ROUNDS):
                writer.delete("/api/v1/runs/race", headers=AUTH)
                posted = writer.post("/api/v1/reports", content=_report(n), headers=HEADERS)
                assert posted.status_code == 201, posted.text
                for path in ("/api/v1/runs/race", "/api/v1/runs/race/breakdown"):
                    owners = _owners(writer.get(path))
                    if owners != [f"round{n}"]:
                        stale.append(f"round {n}: {path} served {owners}")
                if f'owner_id="round{n}"' not in writer.get(DETAIL).text:
                    stale.append(f"round {n}: /metrics lacks round{n}")
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert stale == []
