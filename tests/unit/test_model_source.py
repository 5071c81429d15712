"""memest preflight --model: config.json from a model folder or the Hugging Face hub cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memest.errors import CommandError
from memest.model_source import hub_cache_dir, model_config_path
from tests import deploy_init

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def test_hub_cache_dir_follows_huggingface_hub_precedence(tmp_path: Path) -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache_dir({"HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}) == Path("/b/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")


def test_a_folder_gives_its_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert model_config_path(str(tmp_path)) == tmp_path / "config.json"


def test_an_id_is_read_from_the_cache_at_its_revision(tmp_path: Path) -> None:
    # hub_cache lays the cache out as huggingface_hub does (and checks its lookup agrees).
    target = deploy_init.hub_cache(tmp_path / "hub", MODEL)
    env = {"HF_HOME": str(tmp_path)}
    assert model_config_path(MODEL, env=env) == target
    assert model_config_path(MODEL, deploy_init.COMMIT, env=env) == target


@pytest.mark.parametrize(
    ("model", "revision", "says"),
    [
        (MODEL, "main", "is not in the hub cache"),
        (MODEL, "v2", "is not in the hub cache"),
        ("../escape", "main", "neither a model folder nor a Hugging Face id"),
        ("a/b/c", "main", "neither a model folder nor a Hugging Face id"),
    ],
)
def test_what_cannot_be_read_is_named(tmp_path: Path, model: str, revision: str, says: str) -> None:
    if model == MODEL and revision == "v2":
        deploy_init.hub_cache(tmp_path / "hub", MODEL)
    with pytest.raises(CommandError, match=says):
        model_config_path(model, revision, env={"HF_HOME": str(tmp_path)})


def test_preflight_reads_the_model_as_from_its_config_file(tmp_path: Path) -> None:
    deploy_init.hub_cache(tmp_path / "hub", MODEL)
    flags = ["--gpu", "h200", "--max-num-seqs", "128", "--max-model-len", "4096", "--json"]

    def run(*source: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "memest", "preflight", *source, *flags],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "HF_HOME": str(tmp_path)},
        )
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    assert run("--model", MODEL) == run("--model-config", str(deploy_init.LLAMA_CONFIG))
