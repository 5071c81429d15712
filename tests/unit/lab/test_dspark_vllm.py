"""The lab's DSpark configuration as vLLM 0.33.0 itself resolves it, on this CPU.

dspark_vllm_cpu.py builds the engine configuration of P_qwen3_8b12l_dspark7_s64_t2048 in a
subprocess on vLLM's CPU platform, so a draft config vLLM refuses is found before device time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    script = Path(__file__).with_name("dspark_vllm_cpu.py")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
    row: dict[str, Any] = json.loads(line)
    return row


def test_vllm_takes_the_lab_draft_as_dspark(resolved: dict[str, Any]) -> None:
    assert resolved["method"] == "dspark" and resolved["use_dspark"] is True
    assert resolved["architectures"] == ["Qwen3DSparkModel"]
    assert resolved["num_speculative_tokens"] == 7
    assert resolved["use_v2_model_runner"] is True


def test_anchor_sampling_gives_k_query_slots(resolved: dict[str, Any]) -> None:
    # DSparkSpeculator: num_query_per_req = K when sample_from_anchor (the plan's q = 7), and
    # VllmConfig.num_lookahead_tokens = K for anchor-sampling DSpark (1 + K for fill-in)
    assert resolved["sample_from_anchor"] is True
    assert resolved["num_lookahead_tokens"] == 7


def test_the_draft_reads_three_target_layers(resolved: dict[str, Any]) -> None:
    # target_layer_ids [1, 5, 10] of the 12-layer target, captured after layer id + 1
    assert resolved["aux_layers"] == [2, 6, 11]
    assert "TRITON_ATTN" in resolved["draft_attention_backend"]
