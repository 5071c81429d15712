"""Segments a step opened for the lab's DSA stand-ins' own temporaries (bytes).

The stand-ins of lab/dsa_standins.py compute in torch what DeepGEMM's and vLLM's CUDA kernels
compute on chip: fp8_fp4_mqa_logits' float32 scores per head, the indexer cache gather's index
tensors, the per-row top-k's masked float rows. The kernels allocate nothing but their outputs
(the MQA logits [rows, max_seqlen_k], which the stand-in allocates too, at the line that makes
``logits``). A step's reservation on the H200 therefore holds segments a deployment on
DeepGEMM does not open; the pre-flight, which models the kernels, is compared with the step
less them (lab/preflight_check.py).

A segment belongs to a stand-in when the first frame outside torch is in lab/dsa_standins.py;
it is an output when that frame's source line makes one (``OUTPUT_LINES``). The histories
record line numbers, so the lines read are today's file: calls 33-43 ran lab/dsa_standins.py as
of commit 20e6f7f, unchanged since; an edit that moves its lines needs the source the start ran
(``scratch_segment_bytes``' ``source``).
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

STANDINS = Path(__file__).resolve().parent / "dsa_standins.py"
#: Source lines of lab/dsa_standins.py that allocate a kernel's output, not a temporary.
OUTPUT_LINES = ("logits = torch.empty(",)


def _first_frame(event: dict[str, Any]) -> dict[str, Any] | None:
    for frame in event.get("frames", []):
        if "/torch/" not in frame.get("filename", ""):
            return frame
    return None


def _is_scratch(frame: dict[str, Any] | None, source: list[str]) -> bool:
    if frame is None or not frame.get("filename", "").endswith("dsa_standins.py"):
        return False
    line = int(frame.get("line", 0))
    text = source[line - 1].strip() if 0 < line <= len(source) else ""
    return not text.startswith(OUTPUT_LINES)


def scratch_segment_bytes(snapshot: dict[str, Any], source: list[str] | None = None) -> int:
    """Bytes of the segments a torch memory snapshot's history (``_dump_snapshot``) opened for
    stand-in temporaries. ``source``: lab/dsa_standins.py's lines as the start ran them."""
    lines = source if source is not None else STANDINS.read_text().splitlines()
    return sum(
        int(e["size"])
        for trace in snapshot.get("device_traces", [])
        for e in trace
        if e.get("action") == "segment_alloc" and _is_scratch(_first_frame(e), lines)
    )


def history_scratch_bytes(path: Path) -> int:
    """``scratch_segment_bytes`` of a gzipped pickle the lab's step history wrote."""
    with gzip.open(path, "rb") as handle:
        return scratch_segment_bytes(pickle.load(handle))  # noqa: S301 - the lab's own file
