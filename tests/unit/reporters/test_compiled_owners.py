"""Owners of torch.compile'd code read like the eager path's on every surface.

The synthetic history points at allocation lines of real generated code (torch 2.14's Inductor on
CPU, tests/data/inductor/cpu_wrapper.py.txt) with the map the plugin recorded for it; the lines
are found in the module's text by what they allocate.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from memest.analysis import OwnerRules, analyze
from memest.analysis.owners import COMPILED_PIECE
from memest.cli import main
from memest.reporters.markdown import run_markdown
from memest.reporters.owners import OWNER_LABELS, owner_label
from memest.schema import CompiledCode, RunReport

DATA = Path(__file__).resolve().parents[2] / "data" / "inductor"
START = DATA.parent / "starts" / "call3.A_llama8b_s128_t4096.enable.report.rank0.json"
SOURCE = (DATA / "cpu_wrapper.py.txt").read_text()
CODE = json.loads((DATA / "cpu_wrapper.map.json").read_text())
KEY = CODE["files"][0]["key"]
TOKENS, HIDDEN, FFN, VOCAB = 8, 64, 80, 112  # inductor_block.py's sizes
MiB = 1 << 20


def _line(pattern: str) -> int:
    hits = [i + 1 for i, text in enumerate(SOURCE.splitlines()) if re.search(pattern, text)]
    assert len(hits) == 1, (pattern, hits)
    return hits[0]


LINES = {
    "qkv": _line(rf"buf\d+ = empty_strided_cpu\(\({TOKENS}, {3 * HIDDEN}\),"),
    "sdpa": _line(r"buf\d+ = torch\.ops\.aten\._scaled_dot_product"),
    "gate_up": _line(rf"buf\d+ = empty_strided_cpu\(\({TOKENS}, {2 * FFN}\),"),
    "logits": _line(rf"buf\d+ = empty_strided_cpu\(\({TOKENS}, {VOCAB}\),"),
    "cpp": _line(rf"buf\d+ = empty_strided_cpu\(\({TOKENS}, {FFN}\),"),
}


def _snapshot() -> dict[str, Any]:
    """A capture-stage history: one 2 MiB segment and one 1 MiB block per generated line."""
    lines = list(LINES.values())
    n = len(lines)
    return {
        "format": "memest.allocator_snapshot",
        "version": 1,
        "source": {},
        "frames": [[f"/root/.cache/vllm/inductor_cache/{KEY}", ln, "call"] for ln in lines],
        "stacks": [[i] for i in range(n)],
        "tags": ["", "memest/1;phase=capture;stage=target.piecewise;pool=0,1"],
        "actions": ["segment_alloc", "alloc"],
        "events": {
            "action": [0, 1] * n,
            "addr": [((i // 2) + 1) << 24 for i in range(2 * n)],
            "size": [2 * MiB, MiB] * n,
            "stream": [0] * 2 * n,
            "time_us": list(range(2 * n)),
            "tag": [1] * 2 * n,
            "stack": [i // 2 for i in range(2 * n)],
        },
        "segments": [],
        "windows": [],
        "phases": [],
        "compiled_code": CODE,
    }


def test_every_default_owner_has_a_readable_label() -> None:
    owners = {r.owner for r in OwnerRules.default().rules}
    missing = sorted(o for o in owners if o not in OWNER_LABELS)
    assert missing == []


@pytest.mark.parametrize(
    ("owner", "label"),
    [
        ("qkv_proj", "QKV projection output"),
        ("mlp_gate_up", "MLP gate/up projection"),
        ("qk_norm_rope", "q/k-norm + RoPE"),
        ("logits", "logits (lm_head)"),
        (COMPILED_PIECE, "compiled code (Inductor call; owner not named)"),
        (
            f"{COMPILED_PIECE}:no source node recorded",
            "compiled code — owner not named: no source node recorded",
        ),
        (
            f"{COMPILED_PIECE}:no module map recorded",
            "compiled code — owner not named: this code was compiled in a start without memest, "
            "so its module map was never recorded (start once with memest on and a cold compile "
            "cache, or keep maps across starts in MEMEST_CODE_MAP_DIR)",
        ),
        (
            f"{COMPILED_PIECE}:no rule for layers.*.mlp.mystery",
            "compiled code — owner not named: no rule for layers.*.mlp.mystery",
        ),
        (
            f"{COMPILED_PIECE}:not an allocation site",
            "compiled code — owner not named: not an allocation site",
        ),
    ],
)
def test_compiled_owner_labels(owner: str, label: str) -> None:
    assert owner_label(owner) == label


def test_the_synthetic_history_names_owners_from_the_map() -> None:
    triggers = {t.owner: t.bytes for t in analyze(_snapshot()).triggers}
    assert triggers == {
        "qkv_proj": 2 * MiB,
        "attn_output": 2 * MiB,
        "mlp_gate_up": 2 * MiB,
        "logits": 2 * MiB,
        "compiled_piece:no source node recorded": 2 * MiB,
    }
    assert CompiledCode.model_validate(CODE).files[0].key == KEY


def synthetic_report() -> RunReport:
    """A real H200 start's report carrying this history's breakdown and the map behind it."""
    report = RunReport.model_validate_json(START.read_text())
    return report.model_copy(
        update={
            "report_id": "compiled-owners-1",
            "run_id": "compiled-owners-run",
            "source": "synthetic",
            "breakdown": analyze(_snapshot()),
            "compiled_code": CompiledCode.model_validate(CODE),
        }
    )


def test_analyze_names_compiled_owners_as_it_names_eager_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "snapshot.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_snapshot()).encode()))
    assert main(["analyze", str(path), "--md"]) == 0
    out = capsys.readouterr().out
    owners = {row.split("|")[1].strip() for row in out.splitlines() if "| call (" in row}
    assert owners == {
        "qkv_proj",
        "attn_output",
        "mlp_gate_up",
        "logits",
        "compiled_piece:no source node recorded",
    }


def test_report_markdown_labels_compiled_owners() -> None:
    md = run_markdown(synthetic_report())
    rows = [r for r in md.splitlines() if r.startswith("|  | ")]
    labels = {r.split("|")[2].strip() for r in rows}
    assert "QKV projection output" in labels
    assert "compiled code — owner not named: no source node recorded" in labels
    assert not any(label.startswith(("qkv_proj", "compiled_piece")) for label in labels)
