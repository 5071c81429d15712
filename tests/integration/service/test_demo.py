"""`memest serve --demo`: real H200 starts beside the published figures, every page with data."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi.testclient import TestClient

from memest.demo.h200 import H200_STARTS, h200_reports
from tests.integration.service.conftest import joined_samples

RAW = Path(__file__).parents[3] / "reports" / "vllm" / "raw"


def test_the_demo_starts_are_the_committed_reports_verbatim() -> None:
    for name in H200_STARTS:
        packaged = Path(__file__).parents[3] / "memest" / "demo" / "h200" / f"{name}.json"
        assert packaged.read_bytes() == (RAW / f"{name}.report.rank0.json").read_bytes(), name


def test_demo_run_pages_draw_the_whole_gpu_and_answer_the_what_if(
    demo_client: TestClient,
) -> None:
    for report in h200_reports():
        run_id = quote(report.run_id, safe="")
        page = demo_client.get(f"/models/{report.model}", params={"run": report.run_id})
        assert page.status_code == 200, report.run_id
        assert 'id="whole-gpu-plot"' in page.text, report.run_id
        answer = demo_client.post(
            f"/api/v1/runs/{run_id}/estimate", json={"grid": {"max_num_seqs": 32}}
        )
        assert answer.status_code == 200, (report.run_id, answer.text)
        assert answer.json()["what_if"]["kv_tokens_to"] > 0


def test_demo_metrics_split_one_configuration_by_mode(demo_client: TestClient) -> None:
    # call20 (enable: vLLM sized the KV cache) and call22 (apply: memest did) share a
    # configuration; vLLM allocated 52,735 and 52,253 blocks of 16 tokens: 843,760 and 836,048.
    samples = joined_samples(demo_client.get("/metrics").text)
    llama: dict[tuple[str, str], set[float]] = {}
    for (name, pairs), value in samples.items():
        labels = dict(pairs)
        if name == "memest_kv_tokens" and labels["model"] == "llama8b":
            llama.setdefault((labels["mode"], labels["sized_by"]), set()).add(value)
    assert 843760 in llama[("measure", "vllm")], llama
    assert 836048 in llama[("apply", "memest")], llama
