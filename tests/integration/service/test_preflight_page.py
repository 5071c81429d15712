"""The pre-flight page: a form over POST /api/v1/preflight's fields whose table and flag are the
ones `memest preflight` prints for the same model and flags."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memest.cli import main

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "examples" / "llama8b.config.json"
FLAGS = {"max_num_seqs": "128", "max_num_batched_tokens": "4096", "max_model_len": "4096"}


def _submit(client: TestClient, **fields: str) -> tuple[int, str]:
    form = {"model_config": CONFIG.read_text(), **FLAGS, **fields}
    r = client.post("/preflight", data=form)
    return r.status_code, r.text


def test_the_form_opens_filled_with_an_example(client: TestClient) -> None:
    page = client.get("/preflight")
    assert page.status_code == 200
    assert 'id="preflight-form"' in page.text and "LlamaForCausalLM" in page.text


def test_the_page_shows_the_clis_table_and_flag(
    client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    status, page = _submit(client)
    assert status == 200, page
    argv = ["preflight", "--model-config", str(CONFIG)]
    for name, value in FLAGS.items():
        argv += [f"--{name.replace('_', '-')}", value]
    assert main(argv) == 0
    cli = capsys.readouterr().out
    flag = re.search(r"^vLLM flag: (\S+)$", cli, re.M)
    assert flag is not None
    shown = re.search(r'<code id="kv-flag">([^<]+)</code>', page)
    assert shown is not None and shown.group(1) == flag.group(1)
    api = client.post(
        "/api/v1/preflight", json={"model_config": json.loads(CONFIG.read_text()), **FLAGS}
    ).json()
    assert (
        api["kv_cache_flag"] == flag.group(1) == f"--kv-cache-memory-bytes={api['kv_cache_bytes']}"
    )
    # Each term row of the page is a row of the CLI's table, with the same label and GiB.
    rows = re.findall(
        r'<tr data-term="[^"]+"[^>]*><td>([^<]+)</td><td class="num"[^>]*>([^<]+)<', page
    )
    assert len(rows) >= 8
    for label, gib in rows:
        assert re.search(rf"^{re.escape(html.unescape(label))}\s+{re.escape(gib)}\b", cli, re.M)
    # A dense model gets no MLA row, on either surface.
    assert "MLA prefill" not in page and "MLA prefill" not in cli


def test_a_refused_field_shows_the_form_again_naming_it(client: TestClient) -> None:
    status, page = _submit(client, max_model_len="131072")
    assert status == 422 and 'id="preflight-error"' in page
    assert "max_model_len" in page and "max_position_embeddings=8192" in page
    status, page = _submit(client, max_num_seqs="many")
    assert status == 422 and "max_num_seqs" in page and "whole number" in page


def test_the_page_refuses_what_the_api_refuses(client: TestClient) -> None:
    """The page computes in the calculator workers with the API's input limits: a config of
    3,000 layers is refused with the field named, not computed."""
    config = json.loads(CONFIG.read_text())
    config["num_hidden_layers"] = 3000
    status, page = _submit(client, model_config=json.dumps(config))
    assert status == 422
    assert "model_config.num_hidden_layers" in html.unescape(page)
