"""The service API on SQLite: ingest rules, reads, comparisons and histories against the seed."""

from __future__ import annotations

import json
import re

from fastapi.testclient import TestClient

from memest.demo import demo_report
from memest.schema import RunReport
from memest.units import GiB
from tests.integration.service.conftest import AUTH, MakeClient

DS_MAIN = "demo-deepseek-v4-flash-dspark-k7-main"
DS_PR = "demo-deepseek-v4-flash-dspark-k7-pr"
MM_MAIN = "demo-minimax-m3-eagle3-k3-main"
MM_PR = "demo-minimax-m3-eagle3-k3-pr"


def _report(**changes: object) -> RunReport:
    base = demo_report("minimax-m3-eagle3-k3", "PR")
    data = json.loads(base.model_dump_json())
    data.update({"report_id": "r-test-1", "run_id": "run-test-1", "source": "synthetic"})
    data.update(changes)
    return RunReport.model_validate(data)


def _post(client: TestClient, body: str | bytes, headers: dict[str, str] | None = None) -> object:
    h = {"Content-Type": "application/json", **(headers if headers is not None else AUTH)}
    return client.post("/api/v1/reports", content=body, headers=h)


def _count(client: TestClient) -> int:
    count: int = client.get("/api/v1/runs").json()["count"]
    return count


def test_ingest_is_idempotent_by_report_id(client: TestClient) -> None:
    # GIVEN a valid report
    body = _report().model_dump_json()
    # WHEN it is sent twice
    first = client.post(
        "/api/v1/reports", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    second = client.post(
        "/api/v1/reports", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    # THEN it is stored once
    assert first.status_code == 201 and first.json()["status"] == "created"
    assert second.status_code == 200 and second.json()["status"] == "exists"
    assert _count(client) == 1
    stored = client.get("/api/v1/reports/r-test-1").json()
    assert RunReport.model_validate(stored) == _report()


def test_same_id_other_content_is_a_conflict(client: TestClient) -> None:
    _post(client, _report().model_dump_json())
    r = _post(client, _report(notes=["changed"]).model_dump_json())
    assert r.status_code == 409  # type: ignore[attr-defined]
    assert r.json()["field"] == "report_id"  # type: ignore[attr-defined]


def test_writes_without_token_get_401_and_change_nothing(client: TestClient) -> None:
    body = _report().model_dump_json()
    no_token = _post(client, body, headers={})
    wrong = _post(client, body, headers={"Authorization": "Bearer nope"})
    assert no_token.status_code == 401 and wrong.status_code == 401  # type: ignore[attr-defined]
    assert _count(client) == 0
    assert client.get("/api/v1/reports/r-test-1").status_code == 404


def test_server_without_write_token_refuses_writes(make_client: MakeClient) -> None:
    c = make_client(write_token=None)
    r = _post(c, _report().model_dump_json())
    assert r.status_code == 403  # type: ignore[attr-defined]
    assert _count(c) == 0


def test_read_token_guards_reads_when_set(make_client: MakeClient) -> None:
    c = make_client(read_token="reader", demo=True)
    assert c.get("/api/v1/models").status_code == 401
    assert c.get("/models/nvidia/MiniMax-M3-NVFP4").status_code == 401
    assert c.get("/metrics").status_code == 401
    ok = c.get("/api/v1/models", headers={"Authorization": "Bearer reader"})
    assert ok.status_code == 200 and ok.json()["count"] == 5  # 2 published, 3 real H200 models
    assert c.get("/healthz").status_code == 200


def test_malformed_report_gets_422_naming_the_field(client: TestClient) -> None:
    data = json.loads(_report().model_dump_json())
    del data["config"]
    r = _post(client, json.dumps(data))
    assert r.status_code == 422  # type: ignore[attr-defined]
    assert r.json()["field"] == "config"  # type: ignore[attr-defined]
    data = json.loads(_report().model_dump_json())
    data["breakdown"]["stages"][0]["pool_growth_bytes"] = -5
    r = _post(client, json.dumps(data))
    assert r.status_code == 422  # type: ignore[attr-defined]
    assert r.json()["field"] == "breakdown.stages.0.pool_growth_bytes"  # type: ignore[attr-defined]
    data = json.loads(_report().model_dump_json())
    data["bogus"] = 1
    r = _post(client, json.dumps(data))
    assert r.status_code == 422 and r.json()["field"] == "bogus"  # type: ignore[attr-defined]
    assert _count(client) == 0


def test_bad_json_wrong_type_and_schema_version(client: TestClient) -> None:
    r = _post(client, b"{not json")
    assert r.status_code == 422 and r.json()["field"] == "body"  # type: ignore[attr-defined]
    r = _post(client, b"[1, 2]")
    assert r.status_code == 422 and r.json()["field"] == "body"  # type: ignore[attr-defined]
    data = json.loads(_report().model_dump_json())
    data["schema_version"] = "2"
    r = _post(client, json.dumps(data))
    assert r.status_code == 422 and r.json()["field"] == "schema_version"  # type: ignore[attr-defined]
    r = client.post(
        "/api/v1/reports", content=b"x=1", headers={**AUTH, "Content-Type": "text/plain"}
    )
    assert r.status_code == 415 and r.json()["field"] == "content-type"
    assert _count(client) == 0


def test_oversized_report_gets_413(make_client: MakeClient) -> None:
    c = make_client(max_report_bytes=4096)
    body = _report(notes=["x" * 5000]).model_dump_json()
    r = _post(c, body)
    assert r.status_code == 413 and r.json()["field"] == "body"  # type: ignore[attr-defined]

    # A chunked body (no Content-Length) is cut off as it streams.
    def chunks() -> object:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000].encode()

    r2 = c.post(
        "/api/v1/reports",
        content=chunks(),  # type: ignore[arg-type]
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert r2.status_code == 413
    assert _count(c) == 0


def test_storage_limits_are_422_not_500(client: TestClient) -> None:
    cases = {
        "run_id": _report(run_id="has/slash"),
        "rank": _report(rank=4, world_size=4),
        "model": _report(model="m" * 301),
    }
    for field, rep in cases.items():
        r = _post(client, rep.model_dump_json())
        assert r.status_code == 422, field  # type: ignore[attr-defined]
        assert r.json()["field"] == field  # type: ignore[attr-defined]
    data = json.loads(_report().model_dump_json())
    data["breakdown"]["event_count"] = 2**70
    r = _post(client, json.dumps(data))
    assert r.status_code == 422  # type: ignore[attr-defined]
    assert r.json()["field"] == "breakdown.event_count"  # type: ignore[attr-defined]
    assert _count(client) == 0


def test_ranks_of_one_run_must_agree_on_the_run(client: TestClient) -> None:
    assert _post(client, _report().model_dump_json()).status_code == 201  # type: ignore[attr-defined]
    other_model = _report(report_id="r-test-2", rank=1, model="other/model")
    r = _post(client, other_model.model_dump_json())
    assert r.status_code == 409 and r.json()["field"] == "model"  # type: ignore[attr-defined]
    same_rank = _report(report_id="r-test-3")
    r = _post(client, same_rank.model_dump_json())
    assert r.status_code == 409 and r.json()["field"] == "rank"  # type: ignore[attr-defined]


def test_run_detail_shows_all_ranks_and_their_agreement(client: TestClient) -> None:
    for rank in range(4):
        rep = _report(report_id=f"r-{rank}", rank=rank)
        assert _post(client, rep.model_dump_json()).status_code == 201  # type: ignore[attr-defined]
    detail = client.get("/api/v1/runs/run-test-1").json()
    assert detail["run"]["ranks"] == [0, 1, 2, 3]
    assert detail["rank_check"]["agree"] is True
    assert detail["rank_check"]["ranks_missing"] == []
    # A rank whose target FULL pool differs by 1 GiB disagrees.
    data = json.loads(_report(report_id="r-x0", run_id="run-test-2").model_dump_json())
    _post(client, json.dumps(data))
    data["report_id"], data["rank"] = "r-x1", 1
    data["breakdown"]["stages"][1]["pool_growth_bytes"] += GiB
    _post(client, json.dumps(data))
    check = client.get("/api/v1/runs/run-test-2").json()["rank_check"]
    assert check["agree"] is False
    assert check["disagreeing_stages"] == ["target.full"]
    assert check["ranks_missing"] == [2, 3]
    page = client.get("/models/nvidia/MiniMax-M3-NVFP4", params={"run": "run-test-2"}).text
    assert "ranks disagree</span> on target.full" in page and "missing ranks 2, 3" in page
    page = client.get("/models/nvidia/MiniMax-M3-NVFP4", params={"run": "run-test-1"}).text
    assert "ranks 0, 1, 2, 3 agree" in page


def test_run_filters(demo_client: TestClient) -> None:
    c = demo_client
    # The demo: 4 published GB200 runs (2026-01-01) and 6 real H200 starts (2026-12-01/02)
    assert c.get("/api/v1/runs").json()["count"] == 10
    by_model = c.get("/api/v1/runs", params={"model": "nvidia/MiniMax-M3-NVFP4"}).json()
    assert {r["run_id"] for r in by_model["data"]} == {MM_MAIN, MM_PR}
    by_build = c.get("/api/v1/runs", params={"build": "main"}).json()
    assert {r["run_id"] for r in by_build["data"]} == {DS_MAIN, MM_MAIN}
    by_commit = c.get("/api/v1/runs", params={"commit": "30c305"}).json()
    assert {r["run_id"] for r in by_commit["data"]} == {DS_PR, MM_PR}
    assert c.get("/api/v1/runs", params={"gpu": "NVIDIA GB200"}).json()["count"] == 4
    assert c.get("/api/v1/runs", params={"gpu": "NVIDIA H200"}).json()["count"] == 6
    window = {"since": "2026-01-01T01:30:00Z", "until": "2026-06-01T00:00:00Z"}
    since = c.get("/api/v1/runs", params=window).json()
    assert {r["run_id"] for r in since["data"]} == {MM_MAIN, MM_PR}
    until = c.get("/api/v1/runs", params={"until": "2026-01-01T00:30:00Z"}).json()
    assert {r["run_id"] for r in until["data"]} == {DS_MAIN}
    page = c.get("/api/v1/runs", params={"limit": 1, "offset": 1}).json()
    assert page["count"] == 10 and len(page["data"]) == 1


def _gib(n: int | None) -> str:
    assert n is not None
    return f"{n / GiB:.3f}"


#: vLLM 0.33.0's capture sizes on SM100 (VllmConfig._set_cudagraph_sizes) at 1,024 seqs and
#: K = 7: maximum min(1024 x (1 + 7) x 2, 1024) = 1024; 1, 2, 4, every 8 to 248, every 16 from
#: 256 to 1024: 3 + 31 + 49 = 83 sizes (every decode size n x 8 <= 1024 is among them).
MAIN_SIZES_K7 = [1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)]


def _uniform_decode_counts(q: int, limit: int) -> set[int]:
    """Request counts of vLLM's uniform-decode graphs at query length q: each capture size
    rounded up to a multiple of q (CudaGraphManager._init_candidates), at most ``limit``."""
    return {-(-s // q) for s in MAIN_SIZES_K7 if -(-s // q) <= limit}


def test_compare_reproduces_the_seeds_main_to_pr_columns(demo_client: TestClient) -> None:
    cmp = demo_client.get("/api/v1/compare", params={"a": DS_MAIN, "b": DS_PR}).json()
    stages = {d["key"]: d for d in cmp["stages"]}
    # Measured on GB200 and published by the seed (memest.demo's SEED_DOCUMENT), GiB per capture
    # stage, main -> PR: DeepSeek-V4-Flash + DSpark K=7. The API must give them back unchanged.
    published = {
        "target.piecewise": ("0.912", "3.531"),
        "target.full": ("2.674", "10.525"),
        "draft.block.full": ("0.740", "2.994"),
        "total": ("4.326", "17.051"),
    }
    for key, columns in published.items():
        assert (_gib(stages[key]["a"]), _gib(stages[key]["b"])) == columns, key
    # The pool total is the stages' sum: 0.912 + 2.674 + 0.740 = 4.326; 3.531 + 10.525 + 2.994
    # = 17.050 (17.051 published: each figure rounded apart).
    # Graph counts from the rules, not the table. main = vLLM 0.33.0: PIECEWISE takes every size
    # (83); target FULL at q = 8 takes ceil(s / 8) <= 1024 / 8 = 128: 1, 1..31, 32..128 by 2 = 80
    # distinct; DSpark's block routine at q = K = 7 takes ceil(s / 7) <= 1024 // 7 = 146: 1,
    # ceil(8k / 7) for k = 1..31, ceil(16j / 7) up to 1008 / 7 = 144: 1 + 31 + 48 = 80.
    main = (len(MAIN_SIZES_K7), len(_uniform_decode_counts(8, 128)))
    main_block = len(_uniform_decode_counts(7, 146))
    assert (main, main_block, max(_uniform_decode_counts(7, 146))) == ((83, 80), 80, 144)
    # PR = the seed's five fields at its GB200 defaults: PIECEWISE to 8,192 tokens (39 sizes,
    # Appendix A d), FULL decode to 4096 // 8 = 512 requests (48) and 4096 // 7 = 585 (51): the
    # published table's counts.
    expected = {
        "target.piecewise": (main[0], 39),
        "target.full": (main[1], 48),
        "draft.block.full": (main_block, 51),
    }
    counts = {d["key"]: (d["a"], d["b"]) for d in cmp["stage_graph_counts"]}
    assert counts == {**expected, "total": (83 + 80 + 80, 39 + 48 + 51)}
    # memest.plan's capture plans give the same counts as the rules above.
    runners = {d["key"]: (d["a"], d["b"]) for d in cmp["runners"]}
    assert runners == expected
    phases = {d["key"]: (_gib(d["a"])[:-1], _gib(d["b"])[:-1]) for d in cmp["phases"]}
    assert phases["total"] == ("5.81", "18.66")  # published: total CUDA-graph memory
    # KV capacity ratio from the published KV tokens: 6,208,214 / 7,660,426 = 0.8104.
    assert round(cmp["kv_ratio"], 4) == round(6_208_214 / 7_660_426, 4)
    est = {d["key"]: d for d in cmp["estimate"]}
    assert (est["kv_tokens"]["a"], est["kv_tokens"]["b"]) == (7_660_426, 6_208_214)
    owners = {d["key"]: d for d in cmp["owners"]}
    # published trigger: the DSA indexer's logits converted BF16 -> FP32 in the widest FULL graph
    assert _gib(owners["target.full/indexer_logits_fp32"]["b"]) == "8.016"


def test_compare_minimax(demo_client: TestClient) -> None:
    cmp = demo_client.get("/api/v1/compare", params={"a": MM_MAIN, "b": MM_PR}).json()
    counts = {d["key"]: (d["a"], d["b"]) for d in cmp["stage_graph_counts"]}
    assert counts["total"] == (411, 270)
    stages = {d["key"]: d for d in cmp["stages"]}
    assert (_gib(stages["total"]["a"]), _gib(stages["total"]["b"])) == ("1.799", "6.127")
    assert round(cmp["kv_ratio"], 2) == 0.94


def test_history_flags_regressions(demo_client: TestClient) -> None:
    h = demo_client.get("/api/v1/history", params={"model": "deepseek-ai/DeepSeek-V4-Flash-DSpark"})
    points = h.json()["points"]
    assert [p["build"] for p in points] == ["main", "PR"]
    assert points[0]["regressions"] == []
    # KV 7,660,426 -> 6,208,214 and pool 4.326 -> 17.051 GiB both regress; the vLLM estimate's
    # error shrinks in magnitude (+4.73 -> -3.81 GiB), so it does not.
    assert points[1]["regressions"] == ["kv_tokens", "graph_pool_bytes"]
    assert demo_client.get("/api/v1/history", params={"model": "nope"}).status_code == 404


def test_run_detail_has_plan_breakdown_and_estimates(demo_client: TestClient) -> None:
    d = demo_client.get(f"/api/v1/runs/{DS_PR}").json()
    assert d["facts"]["kv_tokens"] == 6_208_214
    assert _gib(d["facts"]["graph_pool_bytes"]) == "17.051"
    assert d["capture_plans"][0]["sizing"] == "seed"
    assert [r["graph_count"] for r in d["runners"]] == [39, 48, 51]
    full = next(s for s in d["stages"] if s["stage"] == "target.full")
    assert [o["owner"] for o in full["owners"]][:2] == [
        "indexer_logits_fp32",
        "indexer_logits_bf16",
    ]
    assert d["rank_check"]["agree"] is None and d["rank_check"]["ranks_missing"] == [1, 2, 3]
    # Published reports carry no phase readings, so memest.estimate cannot compute one: say why.
    assert d["computed_estimate"] is None and d["computed_estimate_unavailable"]
    bd = demo_client.get(f"/api/v1/runs/{DS_PR}/breakdown").json()
    assert bd["breakdown"]["graph_pool_growth_bytes"] == d["facts"]["graph_pool_bytes"]
    assert demo_client.get(f"/api/v1/runs/{DS_PR}/ranks/0").json()["report_id"] == f"{DS_PR}-rank0"
    assert demo_client.get(f"/api/v1/runs/{DS_PR}/ranks/1").status_code == 404
    assert demo_client.get("/api/v1/runs/nope").status_code == 404


def test_plan_endpoint_matches_published_graph_counts(client: TestClient) -> None:
    params = {"gpu": "gb200", "speculative_method": "eagle3", "num_speculative_tokens": 3}
    seed = client.get("/api/v1/plan", params={**params, "sizing": "seed"}).json()
    main = client.get("/api/v1/plan", params={**params, "sizing": "vllm-0.33.0"}).json()
    assert (main["total_graphs"], seed["total_graphs"]) == (411, 270)
    bad = client.get("/api/v1/plan", params={"gpu": "tpu9"})
    assert bad.status_code == 422 and bad.json()["field"] == "gpu"


def test_estimate_endpoint_explains_an_incomplete_report(client: TestClient) -> None:
    body = demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json()
    r = client.post("/api/v1/estimate", content=body, headers={"Content-Type": "application/json"})
    # A published report has no phase readings: memest.estimate refuses it with a reason.
    assert r.status_code == 422
    assert "cannot use this input" in r.json()["detail"]
    assert "phase 'weights' is missing" in r.json()["detail"]


def test_metrics_export_stored_series_and_ingest_counters(demo_client: TestClient) -> None:
    _post(demo_client, _report().model_dump_json())
    _post(demo_client, b"{}")
    text = demo_client.get("/metrics", params={"detail": "true"}).text
    # Published reports do not say who sized the KV cache: mode measure, sized_by unknown; the
    # set's labels are on its memest_run_info line, its values labelled model and key.
    info = r'memest_run_info\{{build="{}",config="[0-9a-f]{{16}}",key="([0-9a-f]{{8}})",'
    info += r'mode="measure",model="{}",sized_by="unknown"\}} 1\n'
    ds = "deepseek-ai/DeepSeek-V4-Flash-DSpark"
    ds_pr = re.findall(info.format("PR", re.escape(ds)), text)
    assert len(ds_pr) == 1, ds_pr
    assert re.search(
        rf'memest_graph_pool_bytes\{{key="{ds_pr[0]}",model="{ds}",'
        r'owner_id="indexer_logits_fp32",stage="target\.full"\} 8607114461\n',
        text,
    )
    assert (
        'memest_owner_info{owner="indexer logits, FP32 copy",owner_id="indexer_logits_fp32"} 1\n'
        in text
    )
    assert re.search(rf'memest_estimator_error_bytes\{{estimator="vllm",key="{ds_pr[0]}",', text)
    minimax = "nvidia/MiniMax-M3-NVFP4"
    minimax_main = re.findall(info.format("main", re.escape(minimax)), text)
    assert any(
        f'memest_kv_tokens{{key="{key}",model="{minimax}"}} 3575296\n' in text
        for key in minimax_main
    ), minimax_main
    # Without detail: the fleet's families only.
    fleet = demo_client.get("/metrics").text
    assert "memest_kv_tokens{" in fleet and "memest_run_info{" in fleet
    assert "memest_graph_pool_bytes" not in fleet and "memest_owner_info" not in fleet
    assert demo_client.get("/metrics", params={"detail": "maybe"}).status_code == 422
    assert 'memest_ingest_reports_total{outcome="created"} 1.0' in text
    assert 'memest_ingest_reports_total{outcome="rejected"} 1.0' in text
    _post(demo_client, b"{}", headers={})
    text = demo_client.get("/metrics").text
    assert 'memest_ingest_reports_total{outcome="unauthorized"} 1.0' in text


def test_dashboard_pages_render(demo_client: TestClient) -> None:
    model = demo_client.get("/models/deepseek-ai/DeepSeek-V4-Flash-DSpark")
    assert model.status_code == 200 and 'data-owner="indexer_logits_fp32"' in model.text
    assert "10.525" in model.text
    cmp = demo_client.get("/compare", params={"a": DS_MAIN, "b": DS_PR})
    assert cmp.status_code == 200 and "0.81×" in cmp.text
    hist = demo_client.get("/history/nvidia/MiniMax-M3-NVFP4")
    assert hist.status_code == 200 and 'class="point regression"' in hist.text
    assert demo_client.get("/").status_code == 200
    assert demo_client.get("/static/memest.css").status_code == 200
    assert demo_client.get("/models/nope/nope").status_code == 404


def test_openapi_documents_every_route(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "RunReport" in spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert op.get("description") or op.get("summary"), (method, path)
            ok = op["responses"].get("200") or op["responses"].get("201")
            content = ok.get("content", {})
            assert any("example" in v or "examples" in v for v in content.values()), (method, path)


def test_grafana_dashboard_queries_exported_series(demo_client: TestClient) -> None:
    from importlib import resources

    path = resources.files("memest.service") / "grafana" / "memest-dashboard.json"
    dash = json.loads(path.read_text())
    # The dashboard is for a Prometheus that scrapes with detail=true.
    text = demo_client.get("/metrics", params={"detail": "true"}).text
    exported = set(re.findall(r"^# TYPE (\w+) (\w+)", text, re.M))
    names = {n for n, _ in exported} | {f"{n}_total" for n, kind in exported if kind == "counter"}
    queried = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            queried |= set(re.findall(r"\b(memest_\w+)", target["expr"]))
            if "memest_ingest" not in target["expr"]:
                # One series per configuration: every stored-run panel tells them apart.
                assert "{{config}}" in target["legendFormat"], panel["title"]
                assert 'config=~"$config"' in target["expr"], panel["title"]
    assert queried and queried <= names, queried - names
    assert "config" in {v["name"] for v in dash["templating"]["list"]}


def test_demo_load_keeps_a_differing_stored_report(make_client: MakeClient) -> None:
    # GIVEN a database holding a demo report id with other content
    first = make_client()
    changed = demo_report("minimax-m3-eagle3-k3", "PR").model_copy(update={"notes": ["older"]})
    assert _post(first, changed.model_dump_json()).status_code == 201  # type: ignore[attr-defined]
    # WHEN the demo is loaded into it, THEN the service starts and keeps the stored report
    second = make_client(demo=True)
    assert second.get("/api/v1/runs").json()["count"] == 10
    kept = second.get(f"/api/v1/reports/{MM_PR}-rank0").json()
    assert kept["notes"] == ["older"]


def test_profiling_pass_stages_are_not_counted_twice(client: TestClient) -> None:
    # GIVEN a start that also records the graph-memory profiling pass (a throwaway pool)
    data = json.loads(_report().model_dump_json())
    capture = data["breakdown"]["stages"]
    profiling = [{**s, "phase": "graph_profiling", "pool_growth_bytes": 7 * GiB} for s in capture]
    data["breakdown"]["stages"] = profiling + capture
    assert _post(client, json.dumps(data)).status_code == 201  # type: ignore[attr-defined]
    # WHEN the run is shown and compared with itself
    d = client.get("/api/v1/runs/run-test-1").json()
    cmp = client.get("/api/v1/compare", params={"a": "run-test-1", "b": "run-test-1"}).json()
    # THEN only the capture phase counts: MiniMax PR's 270 graphs and 6.127 GiB (published)
    assert [s["stage"] for s in d["stages"]] == [s["stage"] for s in capture]
    assert {s["phase"] for s in d["stages"]} == {"capture"}
    totals = {x["key"]: x["a"] for x in cmp["stage_graph_counts"]}
    assert totals["total"] == 270
    assert _gib(next(x["a"] for x in cmp["stages"] if x["key"] == "total")) == "6.127"


def test_a_fingerprint_the_run_cannot_store_is_refused(client: TestClient) -> None:
    # GIVEN reports stating a configuration fingerprint past the column's 200 characters, or a NUL
    for bad in ("f" * 201, "ab\x00cd"):
        r = _post(client, _report(config_fingerprint=bad).model_dump_json())
        # THEN each is a 422 naming the field, and nothing is stored
        assert r.status_code == 422  # type: ignore[attr-defined]
        assert r.json()["field"] == "config_fingerprint"  # type: ignore[attr-defined]
    assert _count(client) == 0
    assert _post(client, _report(config_fingerprint="f" * 200).model_dump_json()).status_code == 201  # type: ignore[attr-defined]
