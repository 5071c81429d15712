"""The plugin's map of torch.compile's generated code, on CPU with real Inductor output.

A small Llama-like model (inductor_block.py) is compiled by Inductor the way vLLM compiles
(standalone_compile), once cold and once from the cache in a fresh process with the graph's
module paths stripped, as vLLM does to the graphs it caches.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memest.analysis import OwnerRules, analyze
from memest.schema import CompiledCode

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

from inductor_block import FFN, HIDDEN, TOKENS, VOCAB  # noqa: E402


def _run(mode: str, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{mode}.json"
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "MEMEST_CODE_MAP_DIR": str(tmp / "maps"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "instrumentation")]),
    }
    subprocess.run(
        [sys.executable, str(HERE / "inductor_block.py"), mode, str(out)],
        env=env,
        check=True,
        timeout=540,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def starts(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("inductor")
    return _run("cold", tmp), _run("warm", tmp)


def _alloc_line(source: str, shape: str) -> int:
    """Line of the generated allocation of a ``shape`` float buffer (found in the text)."""
    pat = re.compile(rf"buf\d+ = empty_strided_cpu\(\({shape}\),")
    hits = [i + 1 for i, line in enumerate(source.splitlines()) if pat.search(line)]
    assert hits, shape
    return hits[0]


def test_cold_and_warm_starts_give_the_same_map(starts: tuple[dict[str, Any], ...]) -> None:
    cold, warm = starts
    assert cold["hook_errors"] == [] and warm["hook_errors"] == []
    assert cold["compiled_code"] == warm["compiled_code"]
    assert cold["compiled_code"]["files"], "the generated module was found and parsed"


def test_allocations_in_generated_code_are_charged_to_model_owners(
    starts: tuple[dict[str, Any], ...],
) -> None:
    cold, _ = starts
    code = CompiledCode.model_validate(cold["compiled_code"])
    (key, path), *_ = cold["paths"].items()
    source = Path(path).read_text()
    # GIVEN the generated lines that allocate the qkv, gate/up and logits outputs (their
    # shapes come from the model's sizes), and an allocator history pointing at them
    expected = {
        _alloc_line(source, f"{TOKENS}, {3 * HIDDEN}"): "qkv_proj",
        _alloc_line(source, f"{TOKENS}, {2 * FFN}"): "mlp_gate_up",
        _alloc_line(source, f"{TOKENS}, {VOCAB}"): "logits",
    }
    rules = OwnerRules.default().with_compiled(code)
    for line, owner in expected.items():
        frames = [["torch/_ops.py", 1, "f"], [f"/somewhere/{key}", line, "call"]]
        assert rules.classify(frames)[0] == owner
    # SDPA is an extern op whose comment lists the q/k-norm and RoPE nodes feeding it as well:
    # it is charged to the node that produces it (F.scaled_dot_product_attention), not to them
    sdpa = [
        i + 1
        for i, text in enumerate(source.splitlines())
        if re.search(r"buf\d+ = torch\.ops\.aten\._scaled_dot_product", text)
    ]
    assert len(sdpa) == 1
    assert rules.classify([[key, sdpa[0], "call"]])[0] == "attn_output"
    # and a CPU kernel launch (no source-node comment on CPU) says so
    cpp_line = _alloc_line(source, f"{TOKENS}, {FFN}")
    frames = [[key, cpp_line, "call"]]
    assert rules.classify(frames)[0] == "compiled_piece:no source node recorded"


def test_the_analysis_of_a_history_names_the_owners(starts: tuple[dict[str, Any], ...]) -> None:
    cold, _ = starts
    (key, path), *_ = cold["paths"].items()
    source = Path(path).read_text()
    line = _alloc_line(source, f"{TOKENS}, {3 * HIDDEN}")
    nbytes = TOKENS * 3 * HIDDEN * 4
    snap = {
        "format": "memest.allocator_snapshot",
        "version": 1,
        "source": {},
        "frames": [[key, line, "call"]],
        "stacks": [[0]],
        "tags": ["", "memest/1;phase=capture;stage=target.piecewise;pool=0,1"],
        "actions": ["segment_alloc", "alloc"],
        "events": {
            "action": [0, 1],
            "addr": [4096, 4096],
            "size": [2 << 20, nbytes],
            "stream": [0, 0],
            "time_us": [0, 1],
            "tag": [1, 1],
            "stack": [0, 0],
        },
        "segments": [],
        "windows": [],
        "phases": [],
        "compiled_code": cold["compiled_code"],
    }
    breakdown = analyze(snap)
    assert [(t.owner, t.bytes, t.requested_bytes) for t in breakdown.triggers] == [
        ("qkv_proj", 2 << 20, nbytes)
    ]
