"""A model's config.json read from the model itself: its folder, or the Hugging Face cache.

``vllm serve MODEL`` takes a folder or a Hugging Face id; for an id, vLLM (through
huggingface_hub) keeps the files in the hub cache as
``{hub}/models--{org}--{name}/snapshots/{commit}/config.json``, the commit named by
``refs/{revision}``. Reading that layout needs no network and no huggingface_hub; a file not in
the cache is named in the error with the command that puts it there (``hf download MODEL
config.json``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memest.errors import CommandError

CONFIG_NAME = "config.json"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def hub_cache_dir(env: dict[str, str] | None = None) -> Path:
    """The hub cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else
    XDG_CACHE_HOME (or ~/.cache)/huggingface/hub."""
    env = dict(os.environ) if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "huggingface" / "hub"


def _snapshot(repo: Path, revision: str) -> Path | None:
    """The snapshot folder of ``revision`` (a commit, or a ref the cache recorded), or None."""
    if _COMMIT.match(revision):
        return repo / "snapshots" / revision
    try:
        commit = (repo / "refs" / revision).read_text().strip()
    except OSError:
        return None
    return repo / "snapshots" / commit if _COMMIT.match(commit) else None


def model_config_path(
    model: str, revision: str = "main", env: dict[str, str] | None = None
) -> Path:
    """The config.json of ``model``: a folder holding one, or a Hugging Face id in the hub cache.

    Raises:
        CommandError: the folder has no config.json, the id is not one, or the cache lacks it.
    """
    folder = Path(model).expanduser()
    if folder.is_dir():
        path = folder / CONFIG_NAME
        if not path.is_file():
            raise CommandError(f"--model {model!r}: the folder has no {CONFIG_NAME}")
        return path
    if not _REPO_ID.match(model) or ".." in model:
        raise CommandError(f"--model {model!r}: neither a model folder nor a Hugging Face id")
    repo = hub_cache_dir(env) / ("models--" + model.replace("/", "--"))
    snapshot = _snapshot(repo, revision)
    path = (snapshot or repo) / CONFIG_NAME
    if snapshot is None or not path.is_file():
        raise CommandError(
            f"--model {model!r}: {CONFIG_NAME} is not in the hub cache {hub_cache_dir(env)} "
            f"(fetch it: hf download {model} {CONFIG_NAME} --revision {revision})"
        )
    return path
