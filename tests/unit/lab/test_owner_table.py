"""lab/owner_table.py on a synthetic start: named share, size formula, cold/warm comparison."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lab import owner_table
from memest.analysis.inductor import parse_generated
from memest.schema import CompiledCode, CompiledNode, RunConfig, RunReport

ROOT = Path(__file__).resolve().parents[3]
KEY = "ab/cabcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmn.py"
CFG = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}


def _run(tmp: Path, name: str) -> Path:
    text = (ROOT / "tests" / "data" / "inductor" / "triton_wrapper.py.txt").read_text()
    lines = text.splitlines()
    qkv = next(i + 1 for i, ln in enumerate(lines) if "buf1 = empty" in ln)
    silu = next(i + 1 for i, ln in enumerate(lines) if "buf7 = empty" in ln)
    parsed = parse_generated(text, KEY)
    parsed.nodes = {"linear": CompiledNode(module="layers.0.self_attn.qkv_proj")}
    tokens = 512
    qkv_bytes = tokens * (32 + 16) * 128 * 2  # the config's law, written out here
    snap = {
        "format": "memest.allocator_snapshot",
        "version": 1,
        "source": {},
        "frames": [[KEY, qkv, "call"], [KEY, silu, "call"]],
        "stacks": [[0], [1]],
        "tags": ["", f"memest/1;phase=capture;stage=target.piecewise;size={tokens};pool=0,1"],
        "actions": ["segment_alloc", "alloc"],
        "events": {
            "action": [0, 1, 0, 1],
            "addr": [1 << 30, 1 << 30, 2 << 30, 2 << 30],
            "size": [6 << 20, qkv_bytes, 2 << 20, 1 << 20],
            "stream": [0] * 4,
            "time_us": [0, 1, 2, 3],
            "tag": [1] * 4,
            "stack": [0, 0, 1, 1],
        },
        "segments": [],
        "windows": [],
        "phases": [],
        "compiled_code": CompiledCode(files=[parsed]).model_dump(mode="json"),
    }
    run = tmp / name
    run.mkdir()
    with gzip.open(run / "snapshot.rank0.json.gz", "wt") as fh:
        json.dump(snap, fh)
    report = RunReport(run_id=name, model="llama8b", config=RunConfig(model="llama8b"))
    (run / "report.rank0.json").write_text(report.model_dump_json())
    return run


def test_named_share_formula_ratio_and_cold_warm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CFG))
    a, b = _run(tmp_path, "cold"), _run(tmp_path, "warm")
    assert owner_table.main([f"{a}={cfg}", f"{b}={cfg}", "--same", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    # 6 MiB of 8 MiB pool growth is the named qkv projection; both allocations stay live
    assert "6.0 MiB of 8.0 MiB (75.0 %)" in out
    assert (
        "| target.piecewise | qkv_proj | 6.0 MiB | 12288 B x 512 tokens | 6.0 MiB | 1.00 |" in out
    )
    assert "owner tables identical" in out
