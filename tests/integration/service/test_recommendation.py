"""One recommendation per run: the run page's `--kv-cache-memory-bytes` is the flag
`memest estimate --from` prints for the same report, on every report under tests/data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memest.cli import main
from memest.identity import model_display_name
from tests.integration.service.conftest import AUTH, MakeClient

DATA = Path(__file__).parents[2] / "data"
REPORTS = sorted(DATA.rglob("*.report.rank0.json"))


def _cli_flag(path: Path, capsys: pytest.CaptureFixture[str]) -> str | None:
    code = main(["estimate", "--from", str(path)])
    out = capsys.readouterr().out
    if code == 2:
        return None
    assert code == 0
    found = re.search(r"^vLLM flag memest recommends: (\S+)$", out, re.M)
    return found.group(1) if found else None


@pytest.mark.parametrize("path", REPORTS, ids=[str(p.relative_to(DATA)) for p in REPORTS])
def test_the_run_page_recommends_the_clis_flag(
    path: Path, make_client: MakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    report = json.loads(path.read_text())
    client = make_client()
    assert client.post("/api/v1/reports", json=report, headers=AUTH).status_code == 201
    model = model_display_name(report["model"])
    page = client.get(f"/models/{model}", params={"run": report["run_id"]}).text
    shown = re.search(r'<code id="kv-flag">([^<]+)</code>', page)
    cli = _cli_flag(path, capsys)
    assert (shown.group(1) if shown else None) == cli
    assert cli is None or cli.startswith("--kv-cache-memory-bytes=")
    # A start over its own budget says so on the page.
    usage_minus_budget = client.get(f"/api/v1/runs/{report['run_id']}").json()["accounting"][
        "usage_minus_budget_bytes"
    ]
    assert ('id="over-budget"' in page) == (
        usage_minus_budget is not None and usage_minus_budget > 0
    )


def test_the_real_starts_have_a_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    flags = [_cli_flag(p, capsys) for p in REPORTS]
    # Six of the nine carry the phase readings memest's budget needs; the older ones (memest
    # refuses to recompute them, exit 2) get no flag, on the page either.
    assert sum(f is not None for f in flags) >= 6, flags
