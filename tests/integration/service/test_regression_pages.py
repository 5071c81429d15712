"""The pages read regressions as `memest check` does, and say plainly what a run lacks."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

MAIN, PR = "demo-deepseek-v4-flash-dspark-k7-main", "demo-deepseek-v4-flash-dspark-k7-pr"
# call20 (enable) and call22 (apply): one llama8b configuration, vLLM's and memest's KV sizing.
ENABLE, APPLY = "S_llama8b_s128_t4096.enable.1796162056", "S_llama8b_s128_t4096.apply.1796163600"


def _verdict(html: str, card: str) -> str:
    found = re.search(rf'id="{card}-card" data-verdict="([a-z_]*)"', html)
    assert found is not None, card
    return found.group(1)


def test_a_kv_drop_and_a_pool_growth_are_red(demo_client: TestClient) -> None:
    # The published figures: KV 7,660,426 -> 6,208,214 tokens (0.81x, a 19 % drop, past 1 %);
    # graph pool 4.326 -> 17.051 GiB (3.9x, past 5 %).
    html = demo_client.get("/compare", params={"a": MAIN, "b": PR}).text
    assert _verdict(html, "kv-ratio") == "regression"
    assert _verdict(html, "pool-delta") == "regression"
    assert 'class="fact v-regression" id="kv-ratio-card"' in html
    # Reversed, the same change is better on both cards.
    back = demo_client.get("/compare", params={"a": PR, "b": MAIN}).text
    assert _verdict(back, "kv-ratio") == "better"
    assert _verdict(back, "pool-delta") == "better"


def test_a_run_against_itself_is_noise(demo_client: TestClient) -> None:
    html = demo_client.get("/compare", params={"a": ENABLE, "b": ENABLE}).text
    for card in ("kv-ratio", "kv-bytes-delta", "non-kv-delta", "pool-delta"):
        assert _verdict(html, card) == "noise", card


def test_compare_warns_when_the_kv_sizing_differs(demo_client: TestClient) -> None:
    # 843,760 -> 836,048 tokens: 0.9 % less KV, by design (memest's budget in apply mode), so
    # the KV cards are not judged; the graph pool (0.061 GiB on both) still is.
    html = demo_client.get("/compare", params={"a": ENABLE, "b": APPLY}).text
    assert _verdict(html, "kv-ratio") == "other_mode"
    assert _verdict(html, "kv-bytes-delta") == "other_mode"
    assert _verdict(html, "pool-delta") == "noise"
    assert "sized by different estimators (vLLM → memest (MEMEST_ESTIMATE=apply))" in html


def test_published_runs_say_why_there_is_no_what_if(demo_client: TestClient) -> None:
    page = demo_client.get("/models/deepseek-ai/DeepSeek-V4-Flash-DSpark").text
    assert 'id="whatif-unavailable"' in page
    assert 'id="whatif-form"' not in page
    assert "the seed" not in page
    measured = demo_client.get("/models/llama8b").text
    assert 'id="whatif-form"' in measured


def test_index_shows_each_models_newest_figures(demo_client: TestClient) -> None:
    # The newest llama8b run is call26's V_llama8b_defaults.apply: vLLM allocated 56,402 blocks
    # of 16 tokens (902,432 tokens) and used 0.043 GiB less than its budget.
    html = demo_client.get("/").text
    row = html[html.index('title="llama8b"') :]
    row = row[: row.index("</tr>")]
    assert 'data-value="902432"' in row
    assert "-0.043" in row
