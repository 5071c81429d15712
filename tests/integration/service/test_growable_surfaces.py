"""vLLM 0.34's growable KV cache beside memest's terms on every surface: the accounting,
`memest estimate --from`, the run API, the run page and /metrics show the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from memest.estimate import account
from memest.identity import model_display_name
from memest.schema import RunReport
from memest.units import fmt_gib
from tests.integration.service.conftest import AUTH, MakeClient

START = (
    Path(__file__).parents[2]
    / "data"
    / "starts"
    / "call47.A_llama8b_s128_t4096_udef.apply.report.rank0.json"
)


def test_every_surface_shows_the_margin_used(
    make_client: MakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = json.loads(START.read_text())
    acc = account(RunReport.model_validate(raw))
    g = acc.growable_kv
    assert g is not None and g.margin_unused_bytes == 1 << 30  # tests/unit/estimate: by hand

    assert main(["estimate", "--from", str(START)]) == 0
    text = capsys.readouterr().out
    assert "vLLM 0.34 growable KV cache: margin used" in text
    row = next(line for line in text.splitlines() if line.startswith("vLLM's margin memest"))
    assert row.split()[-1] == fmt_gib(1 << 30, signed=True)
    assert main(["estimate", "--from", str(START), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["accounting"]["growable_kv"]
    assert cli == g.model_dump(mode="json")

    client = make_client()
    assert client.post("/api/v1/reports", json=raw, headers=AUTH).status_code == 201
    served = client.get(f"/api/v1/runs/{raw['run_id']}").json()["accounting"]["growable_kv"]
    assert served == g.model_dump(mode="json")
    page = client.get(f"/models/{model_display_name(raw['model'])}", params={"run": raw["run_id"]})
    assert 'id="growable-kv"' in page.text
    assert "measured need (transient)" in page.text
    assert fmt_gib(622_854_144) in page.text
    metrics = client.get("/metrics", params={"detail": "true"}).text
    rows = [line for line in metrics.splitlines() if line.startswith("memest_growable_kv_bytes{")]
    unused = [line for line in rows if 'figure="margin_unused_bytes"' in line]
    assert len(unused) == 1 and float(unused[0].split()[-1]) == 1 << 30
    assert len(rows) == 6
