"""/metrics for a fleet: owners capped per stage, samples stored at ingest (a scrape parses no
report), the exposition rebuilt after an ingest or delete on any replica of one database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memest.demo import demo_report
from memest.service.store import ReportCache
from memest.units import MiB
from tests.integration.service.conftest import AUTH, MakeClient

HEADERS = {**AUTH, "Content-Type": "application/json"}


def _report(run: str, model: str, owners: int = 2) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json())
    data.update(source="synthetic", report_id=f"{run}-r0", run_id=run, model=model)
    bd = data["breakdown"]
    # One stage of 1 + 2 + ... + owners MiB, owner k claiming k MiB.
    total = owners * (owners + 1) // 2 * MiB
    bd["stages"] = [{"stage": "s", "pool_growth_bytes": total}]
    bd["triggers"] = [
        {"stage": "s", "owner": f"o{k}", "bytes": k * MiB} for k in range(1, owners + 1)
    ]
    bd["graph_pool_growth_bytes"] = total
    return data


def _post(client: TestClient, data: dict[str, Any]) -> None:
    answer = client.post("/api/v1/reports", content=json.dumps(data), headers=HEADERS)
    assert answer.status_code == 201, answer.text


def _pool_series(client: TestClient, model: str) -> dict[str, float]:
    """memest_graph_pool_bytes of ``model``: owner -> value."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("memest_graph_pool_bytes{") and f'model="{model}"' in line:
            owner = line.split('owner="', 1)[1].split('"', 1)[0]
            out[owner] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_stage_of_20_owners_exports_its_7_largest_and_other(client: TestClient) -> None:
    _post(client, _report("many", "fleet/many", owners=20))
    series = _pool_series(client, "fleet/many")
    # o20 .. o14 kept (20 .. 14 MiB); o1 .. o13 summed: 13 * 14 / 2 = 91 MiB.
    assert series == {
        **{f"o{k}": float(k * MiB) for k in range(14, 21)},
        "other": float(91 * MiB),
    }


def test_a_scrape_parses_no_stored_report(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _post(client, _report("a", "fleet/a"))

    def refuse(self: ReportCache, row: object) -> None:
        raise AssertionError("a scrape parsed a stored report")

    monkeypatch.setattr(ReportCache, "get", refuse)
    assert _pool_series(client, "fleet/a") == {"o2": 2 * MiB, "o1": 1 * MiB}


def test_replicas_on_one_database_export_each_others_writes(
    make_client: MakeClient, db_url: str
) -> None:
    one = make_client(database_url=db_url)
    two = make_client(database_url=db_url)
    assert _pool_series(two, "fleet/b") == {}  # built and cached before the write
    _post(one, _report("b", "fleet/b"))
    assert _pool_series(two, "fleet/b") == {"o2": 2 * MiB, "o1": 1 * MiB}
    assert _pool_series(one, "fleet/b") == {"o2": 2 * MiB, "o1": 1 * MiB}
    assert two.delete("/api/v1/runs/b", headers=AUTH).status_code == 200
    assert _pool_series(one, "fleet/b") == {}
    # The same ids stored again with other content: the new content is exported.
    _post(two, _report("b", "fleet/b", owners=3))
    assert _pool_series(one, "fleet/b") == {"o3": 3 * MiB, "o2": 2 * MiB, "o1": 1 * MiB}
