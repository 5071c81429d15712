"""POST /api/v1/runs/{run_id}/estimate: the CLI's what-if on a stored run."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from memest.cli import main
from memest.schema import ModelShape

from .conftest import AUTH  # noqa: TID252

ROOT = Path(__file__).resolve().parents[3]
REPORT = ROOT / "tests/data/starts/call9.S_llama8b_s128_t4096.apply.report.rank0.json"
MODEL = ROOT / "examples/llama8b.config.json"
GRID = {"max_num_seqs": 32, "max_num_batched_tokens": 2048}


def _store(client: TestClient) -> str:
    body = REPORT.read_bytes()
    r = client.post(
        "/api/v1/reports", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code in (200, 201), r.text
    return str(json.loads(body)["run_id"])


def test_estimate_on_a_stored_run_matches_the_cli(client: TestClient, capsys: object) -> None:
    run_id = _store(client)
    model = json.loads(MODEL.read_text())
    r = client.post(
        f"/api/v1/runs/{run_id}/estimate",
        json={"grid": GRID, "concurrency": 200, "model_dims": model},
    )
    assert r.status_code == 200, r.text
    got = r.json()
    code = main(
        [
            "estimate",
            "--from",
            str(REPORT),
            "--grid",
            json.dumps(GRID),
            "--model-config",
            str(MODEL),
            "--concurrency",
            "200",
            "--json",
        ]
    )
    assert code == 0
    cli = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert got["what_if"] == cli["what_if"]
    assert got["kv_cache_memory_bytes_to"] == cli["kv_cache_memory_bytes_to"]
    assert got["inverse"] == cli["inverse"]
    terms = {t["term"]: t for t in got["terms"]}
    # 32 seqs instead of 128: the penalties buffers shrink by 96 x 128,256 x 4 B and more
    assert (
        terms["weights_bytes"]["bytes_from"] - terms["weights_bytes"]["bytes_to"] > 96 * 128256 * 4
    )
    assert "penalties" in terms["weights_bytes"]["law"]
    assert got["concurrency_to"] == got["what_if"]["kv_tokens_to"] / 4096


def test_bad_fields_are_a_422_naming_them(client: TestClient) -> None:
    run_id = _store(client)
    cases = [
        ({"grid": {"max_num_sequences": 3}}, "grid.max_num_sequences"),
        ({"grid": {"max_num_seqs": 0}}, "grid.max_num_seqs"),
        ({"kv_tokens": 10, "concurrency": 2}, "concurrency"),
        ({"grid": {"gpu_memory_utilization": 0.8}, "gpu_memory_utilization": 0.9}, "gpu_memory"),
        ({"drafter_dims": {"hidden_size": 1}}, "drafter_dims"),
        ({"model_dims": {"hidden_size": 4096}}, "vocab_size"),
    ]
    for body, field in cases:
        r = client.post(f"/api/v1/runs/{run_id}/estimate", json=body)
        assert r.status_code == 422, (body, r.text)
        assert field in json.dumps(r.json()), (body, r.json())
    r = client.post("/api/v1/runs/no-such-run/estimate", json={})
    assert r.status_code == 404
    r = client.post(f"/api/v1/runs/{run_id}/estimate", json={"grid": {}, "bogus": 1})
    assert r.status_code == 422


def test_every_refusal_is_one_detail_and_field(client: TestClient) -> None:
    run_id = _store(client)
    cases = [
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"kv_tokens": -1}, "kv_tokens"),
        ({"extra": 1}, "extra"),
        ({"grid": None}, "grid"),
        ({"concurrency": 10**9}, "concurrency"),
        ({"grid": {"max_model_len": 99999999999}}, "grid.max_model_len"),
    ]
    for body, field in cases:
        r = client.post(f"/api/v1/runs/{run_id}/estimate", json=body)
        assert r.status_code == 422, (body, r.text)
        got = r.json()
        assert set(got) == {"detail", "field"} and isinstance(got["detail"], str), got
        assert got["field"] == field, (body, got)
        assert "--" not in got["detail"], got  # API errors name API fields, not CLI flags
    r = client.post(
        f"/api/v1/runs/{run_id}/estimate",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 422 and set(r.json()) == {"detail", "field"}


def test_max_model_len_moves_the_concurrency(client: TestClient) -> None:
    run_id = _store(client)
    r = client.post(
        f"/api/v1/runs/{run_id}/estimate",
        json={"grid": {"max_model_len": 8192}, "model_dims": json.loads(MODEL.read_text())},
    )
    assert r.status_code == 200, r.text
    got = r.json()
    w = got["what_if"]
    assert (w["max_model_len_from"], w["max_model_len_to"]) == (4096, 8192)
    assert "max_model_len 8192" in w["grid_to"]
    assert got["concurrency_from"] == w["kv_tokens_from"] / 4096
    assert got["concurrency_to"] == w["kv_tokens_to"] / 8192
    # Twice as long requests: about half as many fit.
    assert abs(got["concurrency_to"] * 2 - got["concurrency_from"]) < 1


def test_max_model_len_past_the_models_positions_is_refused(client: TestClient) -> None:
    """Llama-3-8B has 8,192 positions: 131,072 is refused whether the report records them, the
    request gives the config.json, or nothing says them (then any length past the start's)."""
    report = json.loads(REPORT.read_text())
    config = json.loads(MODEL.read_text())
    report["config"]["model_dims"] = {
        name: config[name] for name in ModelShape.model_fields if name in config
    }
    report["report_id"], report["run_id"] = "f" * 32, "llama8b-with-positions"
    assert client.post("/api/v1/reports", json=report, headers=AUTH).status_code == 201
    stored_bare = _store(client)
    asks = [
        ("llama8b-with-positions", {}, "max_position_embeddings 8192"),
        (
            stored_bare,
            {"model_dims": json.loads(MODEL.read_text())},
            "max_position_embeddings 8192",
        ),
        (stored_bare, {}, "max_position_embeddings is not known"),
    ]
    for run_id, extra, reason in asks:
        body = {"grid": {"max_model_len": 131072}, **extra}
        r = client.post(f"/api/v1/runs/{run_id}/estimate", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "grid.max_model_len" and reason in r.json()["detail"]


def test_the_inverse_never_passes_max_num_batched_tokens(client: TestClient) -> None:
    run_id = _store(client)
    r = client.post(
        f"/api/v1/runs/{run_id}/estimate",
        json={"grid": {"gpu_memory_utilization": 0.9}, "concurrency": 200},
    )
    assert r.status_code == 200, r.text
    inverse = r.json()["inverse"]
    # The start runs max_num_batched_tokens 4096; vLLM refuses max_num_seqs above it.
    assert inverse["largest_max_num_seqs"] <= 4096
    assert inverse["max_num_seqs_ceiling"] == 4096


INT64_MAX = 2**63 - 1


def _set(data: dict[str, object], dotted: str, value: object) -> None:
    *parents, last = dotted.split(".")
    target: object = data
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]  # type: ignore[index]
    assert isinstance(target, dict) and isinstance(target[last], int), dotted
    target[last] = value


def test_int64_max_byte_fields_are_answered_never_a_5xx(client: TestClient) -> None:
    # Stored reports each holding int64's largest value in one byte field, then the what-if on
    # each, at its own grid and at another; and int64's largest value in the request itself.
    fields = [
        "gpu.total_bytes",
        "kv_cache.page_size_bytes",
        "phases.0.end.device_total_bytes",
        "breakdown.graph_pool_growth_bytes",
        "breakdown.stages.0.pool_growth_bytes",
        "breakdown.phases.0.outside_torch_bytes",
        "estimate.components.weights_bytes",
        "estimate.full_init.requested_bytes",
    ]
    asked: list[tuple[str, dict[str, object]]] = []
    for n, field in enumerate(fields):
        data = json.loads(REPORT.read_text())
        _set(data, field, INT64_MAX)
        data.update(run_id=f"int64-{n}", report_id=f"int64-{n}-r0")
        stored = client.post(
            "/api/v1/reports",
            content=json.dumps(data),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert stored.status_code < 500, (field, stored.text)
        if stored.status_code == 201:
            asked += [(f"int64-{n}", {}), (f"int64-{n}", {"grid": GRID})]
    assert asked, "no report with an int64-max byte field was stored"
    run_id = _store(client)
    model = json.loads(MODEL.read_text())
    asked += [
        (run_id, {"kv_tokens": INT64_MAX}),
        (run_id, {"concurrency": INT64_MAX}),
        (run_id, {"model_dims": {**model, "vocab_size": INT64_MAX}}),
        (run_id, {"grid": {"compilation_config": {"cudagraph_capture_sizes": [INT64_MAX]}}}),
    ]
    for run, body in asked:
        answer = client.post(f"/api/v1/runs/{run}/estimate", json=body)
        assert answer.status_code < 500, (run, body, answer.text[:300])
        assert answer.headers["content-type"] == "application/json"
        if answer.status_code >= 400:
            assert isinstance(answer.json()["detail"], str)
