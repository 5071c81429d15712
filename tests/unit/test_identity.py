"""Model names without local paths, build labels, and the configuration fingerprint."""

from __future__ import annotations

import pytest

from memest.identity import (
    FINGERPRINT_HEX_CHARS,
    build_label,
    config_fingerprint,
    model_display_name,
    public_model_name,
    with_default_label,
)
from memest.schema import BuildInfo, RunConfig


@pytest.mark.parametrize(
    ("served", "model", "expected"),
    [
        (None, "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B/snapshots/0a1b2c",
            "/root/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B/snapshots/0a1b2c",
            "Qwen/Qwen3-30B-A3B",
        ),
        ("/mnt/nfs/team/weights/llama-8b/", "/mnt/nfs/team/weights/llama-8b/", "llama-8b"),
        (["my-llama", "alias"], "/data/llama", "my-llama"),
        ("gpt-oss", "openai/gpt-oss-120b", "gpt-oss"),
        (None, "./local-model", "local-model"),
        (None, None, "unknown"),
    ],
)
def test_public_model_name_never_leaks_a_path(served: object, model: object, expected: str) -> None:
    assert public_model_name(served, model) == expected


def test_build_label_names_vllm_and_memest() -> None:
    assert build_label("0.33.0", "0.1.0") == "vllm-0.33.0+memest-0.1.0"
    assert build_label(None, "0.1.0") == "memest-0.1.0"
    info = BuildInfo(vllm_version="0.33.0", memest_version="0.1.0")
    assert with_default_label(info).label == "vllm-0.33.0+memest-0.1.0"
    assert with_default_label(info.model_copy(update={"label": "PR-7"})).label == "PR-7"


def test_fingerprint_groups_launches_of_the_same_setup() -> None:
    base = {"model": "m", "max_num_seqs": 256, "cudagraph_capture_sizes": [1, 2, 4]}
    a = config_fingerprint(RunConfig(**base))
    assert a == config_fingerprint(RunConfig(**dict(reversed(list(base.items())))))
    assert len(a) == FINGERPRINT_HEX_CHARS and int(a, 16) >= 0
    changed = [
        RunConfig(**{**base, "max_num_seqs": 512}),
        RunConfig(**{**base, "model": "other"}),
        RunConfig(**{**base, "cudagraph_capture_sizes": [1, 2]}),
    ]
    assert len({a, *(config_fingerprint(c) for c in changed)}) == 4


@pytest.mark.parametrize(
    ("model", "shown"),
    [
        ("/work/main/.vllm_h200/models/llama8b", "llama8b"),
        ("/srv/weights/Qwen3-8B/", "Qwen3-8B"),
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/0a1b", "Qwen/Qwen3-8B"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("my-llama", "my-llama"),
        # Windows paths: no user folder or drive in a page title either.
        ("C:\\Users\\bob\\models\\phi-3", "phi-3"),
        ("D:\\weights\\Qwen3-8B\\", "Qwen3-8B"),
        ("C:/phi-3", "phi-3"),
        (
            "C:\\Users\\bob\\.cache\\huggingface\\hub\\models--microsoft--phi-3\\snapshots\\ab",
            "microsoft/phi-3",
        ),
    ],
)
def test_model_display_name_keeps_ids_and_names_folders(model: str, shown: str) -> None:
    assert model_display_name(model) == shown
