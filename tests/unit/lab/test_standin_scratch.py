"""lab/standin_scratch.py: which segments of a step's history the DSA stand-ins' temporaries
opened (hand-made histories in torch's _dump_snapshot layout)."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

from lab.standin_scratch import history_scratch_bytes, scratch_segment_bytes

SOURCE = [
    "def fp8_fp4_mqa_logits(q, kv):",
    "    logits = torch.empty((rows, width), dtype=torch.float32)",
    "    score = torch.einsum('mhd,nd->mhn', q, keys).relu_()",
]


def _segment(size: int, filename: str, line: int, action: str = "segment_alloc") -> dict:
    torch_frame = {"filename": "/venv/lib/python3.11/site-packages/torch/functional.py", "line": 9}
    return {
        "action": action,
        "size": size,
        "frames": [torch_frame, {"filename": filename, "line": line, "name": "f"}],
    }


def test_only_stand_in_temporaries_count() -> None:
    standins = "/repo/lab/dsa_standins.py"
    trace = [
        _segment(555_745_280, standins, 3),  # the float32 scores: a temporary
        _segment(2_097_152, standins, 3),
        _segment(16_777_216, standins, 2),  # the logits: the kernel's own output
        _segment(134_217_728, "/venv/vllm/model_executor/layers/linear.py", 242),
        _segment(555_745_280, standins, 3, action="alloc"),  # a block, not a segment
    ]
    snapshot = {"device_traces": [trace]}
    assert scratch_segment_bytes(snapshot, SOURCE) == 555_745_280 + 2_097_152


def test_a_history_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "S.apply-stephist.context_step.pickle.gz"
    snapshot = {"device_traces": [[_segment(4_194_304, "/repo/lab/dsa_standins.py", 1)]]}
    with gzip.open(path, "wb") as handle:
        pickle.dump(snapshot, handle)
    # line 1 of the real stand-ins module is its docstring, no output: a temporary
    assert history_scratch_bytes(path) == 4_194_304


def test_the_check_takes_the_calls_history_of_the_configuration(tmp_path: Path) -> None:
    from lab.preflight_check import context_step_scratch

    results = tmp_path / "results.call99.jsonl"
    logs = tmp_path / "call99-logs"
    logs.mkdir()
    snapshot = {"device_traces": [[_segment(8_388_608, "/repo/lab/dsa_standins.py", 1)]]}
    with gzip.open(logs / "S_cfg.apply-stephist.context_step.pickle.gz", "wb") as handle:
        pickle.dump(snapshot, handle)
    assert context_step_scratch(results, "S_cfg") == 8_388_608
    assert context_step_scratch(results, "other_cfg") == 0
