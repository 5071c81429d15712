#!/usr/bin/env python3
"""The DSA indexer's decode logits in a kept allocator history: the size law at every FULL size.

vLLM 0.33.0's ``sparse_attn_indexer`` (model_executor/layers/sparse_attn_indexer.py) scores, in a
FULL decode graph of B requests with next_n = 1 + K query tokens each, every row against
max_model_len positions: DeepGEMM's paged MQA logits [B x next_n, max_model_len], FP32 on SM90
(one tensor) and BF16 on SM100, where ``as_fp32_logits`` adds the FP32 copy. One call per
indexer layer, so each graph makes num_layers allocations of each.
memest.estimate.indexer.decode_indexer_logits is the law; memest.analysis.owners names them
``indexer_logits_fp32_kernel`` (SM90), ``indexer_logits_bf16`` + ``indexer_logits_fp32`` (SM100).

The windows come in vLLM's capture order (largest first); B for each is the capture plan's
target.full size list, descending.

Usage (no GPU):
    python lab/dsa_logits_law.py SNAPSHOT.json.gz REPORT.json --element-bytes 2|4 [--phase P]
Prints one line per captured size and exits 1 when any window breaks the law.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.dspark_logits_law import window_allocs  # noqa: E402
from memest.analysis.owners import (  # noqa: E402
    INDEXER_LOGITS_BF16,
    INDEXER_LOGITS_FP32_KERNEL,
    indexer_kernel_output_is_fp32,
)
from memest.estimate.indexer import decode_indexer_logits  # noqa: E402
from memest.schema import RunReport  # noqa: E402
from memest.snapshot import load_snapshot  # noqa: E402

STAGE = "target.full"


def named_by_dtype(
    window: dict[str, list[int]], compute_capability: str | None
) -> dict[str, list[int]]:
    """The kernel output renamed as memest's replay names it (owners.indexer_kernel_output_is_fp32)."""
    if INDEXER_LOGITS_BF16 in window and indexer_kernel_output_is_fp32(window, compute_capability):
        window = dict(window)
        window[INDEXER_LOGITS_FP32_KERNEL] = window.pop(INDEXER_LOGITS_BF16)
    return window


def expected(
    report: RunReport, requests: int, element_bytes: int, layers: int
) -> dict[str, list[int]]:
    cfg = report.config
    k = cfg.num_speculative_tokens or 0
    law = decode_indexer_logits(requests, k, int(cfg.max_model_len or 0), element_bytes)
    if element_bytes == 4:
        return {"indexer_logits_fp32_kernel": [law.kernel_bytes] * layers}
    return {
        "indexer_logits_bf16": [law.kernel_bytes] * layers,
        "indexer_logits_fp32": [law.fp32_copy_bytes] * layers,
    }


def check(snap_path: Path, report_path: Path, element_bytes: int, phase: str) -> list[str]:
    """One line per captured size; a line starting with ``FAIL`` breaks the law."""
    report = RunReport.model_validate_json(report_path.read_text())
    plan = next(p for p in report.capture_plans if p.sizing == "vllm-0.33.0")
    row = next(r for r in plan.runners if r.runner == STAGE)
    dims = report.config.model_dims
    layers = int(dims.num_hidden_layers or 0) if dims is not None else 0
    sizes = sorted(row.sizes, reverse=True)
    cc = report.gpu.compute_capability if report.gpu is not None else None
    snap = load_snapshot(snap_path)
    found = window_allocs(snap, phase, STAGE, lambda owner: owner.startswith("indexer_logits"))
    windows = [named_by_dtype(w, cc) for w in found]
    out = []
    if len(windows) != len(sizes):
        out.append(f"FAIL {phase}: {len(windows)} capture windows, plan has {len(sizes)} sizes")
    for requests, got in zip(sizes, windows, strict=False):
        want = expected(report, requests, element_bytes, layers)
        bad = sorted(o for o in set(want) | set(got) if sorted(got.get(o, [])) != want.get(o, []))
        parts = ", ".join(f"{o} {len(got.get(o, []))} x {want[o][0]} B" for o in want)
        head = "FAIL" if bad else "ok"
        out.append(f"{head} {phase} B={requests}: {parts}" + (f" (broken: {bad})" if bad else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("report", type=Path)
    ap.add_argument("--element-bytes", type=int, choices=(2, 4), required=True)
    ap.add_argument("--phase", action="append", default=[], help="capture / graph_profiling")
    args = ap.parse_args(argv)
    lines = [
        line
        for phase in args.phase or ["graph_profiling", "capture"]
        for line in check(args.snapshot, args.report, args.element_bytes, phase)
    ]
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
