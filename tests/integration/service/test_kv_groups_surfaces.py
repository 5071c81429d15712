"""A hybrid start's KV cache per group on every surface: the accounting, `memest estimate
--from`, the run page and /metrics show the same groups, tokens and shares of the budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memest.cli import main
from memest.estimate import account, kv_groups
from memest.estimate.kv_groups import LayerCache, Lengths
from memest.identity import model_display_name
from memest.schema import RunReport
from tests.integration.service.conftest import AUTH, MakeClient

START = (
    Path(__file__).parents[2]
    / "data"
    / "starts"
    / "call11.A_llama8b_s128_t4096.enable-cold.report.rank0.json"
)


def _hybrid() -> dict[str, Any]:
    """Call 11's Llama-8B start with half its layers given a 1,024-token window: two groups
    of 16 layers, each block id half the dense page, so twice the blocks in the same bytes."""
    report = json.loads(START.read_text())
    spec = RunReport.model_validate(report).kv_cache
    assert spec is not None and spec.num_blocks is not None
    layers = [LayerCache("sliding_window", 16, 65536, sliding_window=1024)] * 16
    layers += [LayerCache("full_attention", 16, 65536)] * 16
    hybrid = kv_groups.hybrid_spec(spec, kv_groups.group_layers(layers))
    hybrid = hybrid.model_copy(update={"num_blocks": spec.num_blocks * 2, "kv_tokens": None})
    report["kv_cache"] = hybrid.model_dump(mode="json")
    report["run_id"] += "-hybrid"
    return report


def test_every_surface_shows_the_groups(
    make_client: MakeClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    raw = _hybrid()
    report = RunReport.model_validate(raw)
    acc = account(report)
    assert [g.kind for g in acc.kv_groups] == ["sliding_window", "full_attention"]
    assert sum(g.share for g in acc.kv_groups) == pytest.approx(1)
    assert acc.kv_cache_bytes is not None and acc.kv_tokens is not None
    lengths = Lengths(4096, 4096)
    assert acc.kv_tokens == kv_groups.kv_tokens(report.kv_cache, acc.kv_cache_bytes, lengths)
    full = acc.kv_groups[1]
    assert full.tokens == acc.kv_tokens  # the full group holds max_model_len per request

    path = tmp_path / "hybrid.report.rank0.json"
    path.write_text(json.dumps(raw))
    assert main(["estimate", "--from", str(path)]) == 0
    text = capsys.readouterr().out
    assert "KV cache per group (2 groups, max_model_len 4,096)" in text
    assert f"{full.tokens:,}" in text

    client = make_client()
    assert client.post("/api/v1/reports", json=raw, headers=AUTH).status_code == 201
    served = client.get(f"/api/v1/runs/{raw['run_id']}").json()["accounting"]["kv_groups"]
    assert served == [g.model_dump(mode="json") for g in acc.kv_groups]
    page = client.get(f"/models/{model_display_name(raw['model'])}", params={"run": raw["run_id"]})
    assert 'id="kv-groups"' in page.text
    assert "sliding window (1,024)" in page.text
    assert f"{acc.kv_groups[0].share:.1%}" in page.text
    metrics = client.get("/metrics", params={"detail": "true"}).text
    shares = [line for line in metrics.splitlines() if line.startswith("memest_kv_group_share{")]
    assert len(shares) == 2
    assert any('kind="sliding_window"' in line for line in shares)


@pytest.mark.parametrize(
    ("changes", "lengths", "more"),
    [
        # 2,048 tokens: the window's blocks (cdiv(2,047, 16) + 1 = 129) exceed the full group's
        ({"max_model_len": 2048}, (2048, 4096), False),
        # 512 batched tokens: the window keeps 1,023 + 2 x 512 tokens, 129 blocks against 256
        ({"max_num_batched_tokens": 512}, (4096, 512), True),
    ],
)
def test_the_what_if_moves_window_groups_by_the_new_lengths(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    changes: dict[str, int],
    lengths: tuple[int, int],
    more: bool,
) -> None:
    raw = _hybrid()
    path = tmp_path / "hybrid.report.rank0.json"
    path.write_text(json.dumps(raw))
    assert main(["estimate", "--from", str(path), "--grid", json.dumps(changes), "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    spec = RunReport.model_validate(raw).kv_cache
    assert spec is not None
    want = kv_groups.kv_tokens(spec, w["kv_budget_bytes_to"], Lengths(*lengths))
    assert w["kv_tokens_to"] == want
    # every layer as full attention: two 16-layer halves of each block id per 16 tokens
    dense = kv_groups.num_blocks(spec, w["kv_budget_bytes_to"]) // 2 * 16
    assert (want > dense) == more
