"""/metrics for a fleet: owners capped per stage, samples stored at ingest (a scrape parses no
report), the exposition rebuilt after an ingest or delete on any replica of one database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memest.demo import demo_report
from memest.service.store import ReportCache
from memest.units import MiB
from tests.integration.service.conftest import AUTH, MakeClient, Sample, joined_samples

REPORTS = Path(__file__).resolve().parents[2] / "data" / "reports"
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
    for line in client.get("/metrics", params={"detail": "true"}).text.splitlines():
        if line.startswith("memest_graph_pool_bytes{") and f'model="{model}"' in line:
            owner = line.split('owner_id="', 1)[1].split('"', 1)[0]
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


def _full_build(client: TestClient) -> str:
    """The stored series as a cache built afresh from every stored run writes them (nothing
    kept from earlier scrapes): the reference for the kept text."""
    from memest.service.metrics_cache import MetricsCache

    app: Any = client.app
    fresh = MetricsCache(app.state.sessionmaker, app.state.report_cache.get)
    return fresh.exposition(detail=True).decode()


def _builder_samples(client: TestClient) -> dict[Sample, float]:
    """The stored series as the builder yields them when it parses every exported run's lead
    report at scrape time (no stored samples, no cache), labelled as joined_samples reads the
    exposition (the owner in words is memest_owner_info's): the reference for what it holds."""
    from prometheus_client import generate_latest

    from memest.service import store
    from memest.service.metrics import ServiceMetrics

    app: Any = client.app
    parse = app.state.report_cache.get

    def latest() -> list[Any]:
        with app.state.sessionmaker() as session:
            return store.latest_per_config(session, parse)

    text = generate_latest(ServiceMetrics(latest).registry).decode()
    samples = joined_samples(text)
    return {
        (name, tuple(kv for kv in labels if kv[0] != "owner")): value
        for (name, labels), value in samples.items()
        if not name.startswith("memest_ingest")
    }


def _stored_part(client: TestClient) -> str:
    text = client.get("/metrics", params={"detail": "true"}).text
    return text[: text.index("# HELP memest_ingest")]


def test_the_kept_exposition_reads_as_a_full_build_after_each_change(
    make_client: MakeClient, db_url: str
) -> None:
    one = make_client(database_url=db_url)
    two = make_client(database_url=db_url)
    steps: list[tuple[str, Any]] = [
        ("post", _report("r1", "fleet/x", owners=3)),
        ("post", _report("r2", "fleet/y", owners=12)),
        ("post", {**_report("r3", "fleet/x", owners=5), "created_at": "2030-01-01T00:00:00Z"}),
        # A run whose rank 1 arrives first: its lead report changes when rank 0 arrives.
        (
            "post",
            {
                **_report("r4", "fleet/z", owners=2),
                "world_size": 2,
                "rank": 1,
                "report_id": "r4-r1",
            },
        ),
        ("post", {**_report("r4", "fleet/z", owners=9), "world_size": 2}),
        ("delete", "r3"),
        ("post", _report("r3", "fleet/x", owners=4)),
        # Label values the text format escapes.
        ("post", _report("r5", 'fleet/quote"back\\slash', owners=2)),
    ]
    for i, (action, what) in enumerate(steps):
        writer = (one, two)[i % 2]
        if action == "post":
            _post(writer, what)
        else:
            assert writer.delete(f"/api/v1/runs/{what}", headers=AUTH).status_code == 200
        for reader in (one, two):
            kept = _stored_part(reader)
            assert kept == _full_build(reader), f"after step {i}: {action}"
            assert joined_samples(kept) == _builder_samples(reader), f"after step {i}: {action}"


def test_a_scrape_after_one_ingest_renders_only_that_run(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memest.service import metrics_cache

    for k in range(5):
        _post(client, _report(f"m{k}", f"fleet/m{k}", owners=2))
    client.get("/metrics")
    rendered: list[int] = []
    real = metrics_cache._render

    def counting(samples: list[Any]) -> Any:
        rendered.append(len(samples))
        return real(samples)

    monkeypatch.setattr(metrics_cache, "_render", counting)
    _post(client, _report("m5", "fleet/m5", owners=2))
    assert _pool_series(client, "fleet/m5") == {"o2": 2 * MiB, "o1": 1 * MiB}
    # One run's samples: 2 pool owners, the pool total, KV tokens, KV bytes, non-KV bytes and the
    # estimator errors the demo report's accounting holds (counted from the builder below).
    one_run = [k for k in _builder_samples(client) if ("model", "fleet/m5") in k[1]]
    assert rendered == [len(one_run)]
    assert len(one_run) > 2


def test_a_model_page_is_rendered_once_and_follows_every_change(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _post(client, _report("p1", "fleet/p", owners=3))
    first = client.get("/models/fleet%2Fp")
    assert first.status_code == 200
    assert "o3" in first.text

    def refuse(self: ReportCache, row: object) -> None:
        raise AssertionError("a page was rendered again from the stored report")

    with monkeypatch.context() as patched:
        patched.setattr(ReportCache, "get", refuse)
        again = client.get("/models/fleet%2Fp")
    assert again.text == first.text
    # A second run of the model: listed, and shown as the newest.
    _post(client, {**_report("p2", "fleet/p", owners=5), "created_at": "2030-01-01T00:00:00Z"})
    newer = client.get("/models/fleet%2Fp").text
    assert "p2" in newer and "o5" in newer
    # The first run deleted and stored again with other content: the page shows the new content.
    assert client.delete("/api/v1/runs/p1", headers=AUTH).status_code == 200
    _post(client, _report("p1", "fleet/p", owners=7))
    chosen = client.get("/models/fleet%2Fp", params={"run": "p1"}).text
    assert "o7" in chosen


def test_models_are_listed_a_page_at_a_time(client: TestClient) -> None:
    from memest.service.routers.dashboard import INDEX_MODELS

    names = [f"fleet/page-{k:03d}" for k in range(INDEX_MODELS + 5)]
    for k, name in enumerate(names):
        _post(client, _report(f"pg{k}", name))
    _post(client, {**_report("pg0b", names[0]), "created_at": "2030-01-01T00:00:00Z"})
    first = client.get("/api/v1/models", params={"limit": 3}).json()
    assert first["count"] == len(names)
    assert [m["model"] for m in first["data"]] == names[:3]
    assert (first["data"][0]["runs"], first["data"][0]["latest_run_id"]) == (2, "pg0b")
    last = client.get("/api/v1/models", params={"limit": 3, "offset": len(names) - 2}).json()
    assert [m["model"] for m in last["data"]] == names[-2:]

    # The home page: INDEX_MODELS models, then a link to the rest.
    def listed(page: str) -> str:  # the models table, before the recent runs
        return page.split('id="models"', 1)[1].split("<h2>Recent runs", 1)[0]

    home = client.get("/").text
    assert names[INDEX_MODELS - 1] in listed(home) and names[INDEX_MODELS] not in listed(home)
    assert f'href="?offset={INDEX_MODELS}"' in listed(home)
    rest = listed(client.get("/", params={"offset": INDEX_MODELS}).text)
    assert names[INDEX_MODELS] in rest and names[INDEX_MODELS - 1] not in rest


def test_metrics_are_gzipped_for_a_scraper_that_asks(client: TestClient) -> None:
    import gzip

    _post(client, _report("gz", "fleet/gz", owners=3))
    plain = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    for accept in ("gzip", "deflate, gzip;q=0.5", "*"):
        with client.stream("GET", "/metrics", headers={"Accept-Encoding": accept}) as packed:
            raw = b"".join(packed.iter_raw())
            assert packed.headers["content-encoding"] == "gzip", accept
        assert gzip.decompress(raw) == plain.content
    refused = client.get("/metrics", headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers


def test_a_plain_scrape_holds_five_short_series_per_set(client: TestClient) -> None:
    # A real apply start, whose accounting holds every figure (budget, usage, KV bytes, tokens).
    real = json.loads((REPORTS / "call6.B_llama8b_s32_t2048.apply.report.rank0.json").read_text())
    for run, created in (("f1", "2026-01-01T00:00:00Z"), ("f2", "2030-01-01T00:00:00Z")):
        ids = {"run_id": run, "report_id": f"{run}-r0", "created_at": created}
        _post(client, {**real, **ids, "model": "fleet/f", "source": "synthetic"})
    lines = [ln for ln in client.get("/metrics").text.splitlines() if 'model="fleet/f"' in ln]
    # Two runs of one set: the newest exported, as its info line and the four fleet families.
    names = sorted(ln.split("{", 1)[0] for ln in lines)
    assert names == sorted(
        ["memest_run_info", "memest_kv_tokens", "memest_kv_cache_bytes"]
        + ["memest_budget_bytes", "memest_usage_bytes"]
    )
    (info,) = [ln for ln in lines if ln.startswith("memest_run_info{")]
    key = info.split('key="', 1)[1].split('"', 1)[0]
    for line in lines:
        if line is not info:
            # Only model and key; the value a whole number written as one.
            assert line.split("{", 1)[1].startswith(f'key="{key}",model="fleet/f"}} ')
            assert line.rsplit(" ", 1)[1].lstrip("-").isdigit(), line
