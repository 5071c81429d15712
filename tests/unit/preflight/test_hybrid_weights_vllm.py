"""A hybrid's weights against vLLM 0.33.0's own model classes built on the meta device.

vllm_meta.py (a subprocess on vLLM's CPU platform) instantiates each model as vLLM's loader does
and counts its parameters and its buffers (the rotary cos/sin caches); the pre-flight's weights
law must hold those bytes exactly per tensor-parallel rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memest.preflight import predict
from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = {
    "gemma3_6l": ROOT / "lab/models/gemma3_6l/config.json",
    "gemma3_12l": ROOT / "tests/data/configs/gemma3_12l.json",
    "qwen3next_a3b_4l": ROOT / "lab/models/qwen3next_a3b_4l/config.json",
    "qwen3next_8l": ROOT / "tests/data/configs/qwen3next_8l.json",
    "nemotron_h_8l": ROOT / "tests/data/configs/nemotron_h_8l.json",
    "granite4_8l": ROOT / "tests/data/configs/granite4_8l.json",
}
TPS = (1, 2)


@pytest.fixture(scope="module")
def vllm_meta() -> dict[tuple[str, int], Any]:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "WARNING"}
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("vllm_meta.py")),
        "--tp",
        ",".join(map(str, TPS)),
        *(str(p) for p in CONFIGS.values()),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return {(r["config"], r["tp"]): r for r in rows}


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_hybrid_weights_are_what_vllms_model_class_allocates(
    vllm_meta: dict[tuple[str, int], Any], name: str, tp: int
) -> None:
    row = vllm_meta[(str(CONFIGS[name]), tp)]
    cfg = json.loads(CONFIGS[name].read_text())
    fields = {"model_config_json": cfg, "gpu": "h200", "tensor_parallel_size": tp}
    s = predict.setup(predict.request_from(fields))
    assert s.target_weight_bytes() == row["param_bytes"] + row["buffer_bytes"]
