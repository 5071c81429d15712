#!/usr/bin/env python3
"""DSpark's draft logits in a kept allocator history: each owner's size law at every captured size.

vLLM 0.33.0's DSpark drafter (v1/worker/gpu/spec_decode/dspark/speculator.py,
``DSparkSpeculator._sample_sequential``; model_executor/models/qwen3_dspark.py) allocates, in
each FULL block-routine graph of R requests with K draft steps (``sample_from_anchor``: K query
slots per request), draft vocabulary V and hidden size H, BF16 activations:

- ``draft_sample_hidden``: ``head_hidden[sample_indices[:R*K]]``, R x K x H x 2 B, once;
- ``draft_logits``: ``compute_draft_logits`` (the lm_head over all K positions at once),
  R x K x V x 2 B, once;
- per draft step i < K: ``draft_markov_embed`` (``markov_embed``: markov_w1 of the previous
  token), R x markov_rank x 2 B; ``draft_logits.markov_bias`` (``markov_bias``: markov_w2 over
  that embedding), R x V x 2 B; and ``draft_logits.step`` (``base[:, i] + bias``), R x V x 2 B:
  K allocations of each.

Sizes are the requested bytes the history records (before the allocator's rounding). The windows of the stage come in
the order vLLM captures (widest first: ``CudaGraphManager.capture`` walks its candidates
largest first); R for each is the capture plan's draft.block.full size list, descending.

Usage (no GPU):
    python lab/dspark_logits_law.py SNAPSHOT.json.gz REPORT.json DRAFT_CONFIG.json [--phase P]
Prints one line per captured size and exits 1 when any window breaks a law.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memest.analysis import OwnerRules  # noqa: E402
from memest.schema import RunReport  # noqa: E402
from memest.snapshot import load_snapshot  # noqa: E402
from memest.snapshot.tags import parse_tag  # noqa: E402

STAGE = "draft.block.full"
BF16 = 2
OWNERS = (
    "draft_sample_hidden",
    "draft_logits",
    "draft_markov_embed",
    "draft_logits.markov_bias",
    "draft_logits.step",
)


def laws(requests: int, k: int, vocab: int, hidden: int, rank: int) -> dict[str, tuple[int, int]]:
    """(allocation count, bytes each) per owner in one block-routine graph of ``requests``."""
    return {
        "draft_sample_hidden": (1, requests * k * hidden * BF16),
        "draft_logits": (1, requests * k * vocab * BF16),
        "draft_markov_embed": (k, requests * rank * BF16),
        "draft_logits.markov_bias": (k, requests * vocab * BF16),
        "draft_logits.step": (k, requests * vocab * BF16),
    }


def window_allocs(
    snap: dict[str, Any],
    phase: str,
    stage: str = STAGE,
    wanted: Callable[[str], bool] | None = None,
) -> list[dict[str, list[int]]]:
    """Per capture window of ``stage`` (in capture order): the allocation sizes of each owner
    ``wanted`` keeps (default: the DSpark owners)."""
    keep = wanted or (lambda owner: owner in OWNERS)
    rules = OwnerRules.default()
    tags = [parse_tag(t) for t in snap["tags"]]
    ev, acts = snap["events"], snap["actions"]
    alloc = acts.index("alloc")
    windows: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    owner_of: dict[int, str] = {}
    for i, a in enumerate(ev["action"]):
        tag = tags[ev["tag"][i]]
        if a != alloc or tag.stage != stage or tag.phase != phase or tag.window is None:
            continue
        st = ev["stack"][i]
        if st not in owner_of:
            frames = [snap["frames"][j] for j in snap["stacks"][st]] if st >= 0 else []
            owner_of[st] = rules.classify(frames)[0]
        if keep(owner_of[st]):
            windows[tag.window][owner_of[st]].append(ev["size"][i])
        else:
            windows[tag.window]  # a window with none of them still counts
    return [dict(windows[w]) for w in sorted(windows)]


def check(snap_path: Path, report_path: Path, draft_cfg: dict[str, Any], phase: str) -> list[str]:
    """One line per captured size; a line starting with ``FAIL`` breaks a law."""
    report = RunReport.model_validate_json(report_path.read_text())
    plan = next(p for p in report.capture_plans if p.sizing == "vllm-0.33.0")
    row = next(r for r in plan.runners if r.runner == STAGE)
    k, vocab = row.q, int(draft_cfg.get("draft_vocab_size") or draft_cfg["vocab_size"])
    hidden, rank = int(draft_cfg["hidden_size"]), int(draft_cfg["markov_rank"])
    sizes = sorted(row.sizes, reverse=True)
    windows = window_allocs(load_snapshot(snap_path), phase)
    out = []
    if len(windows) != len(sizes):
        out.append(f"FAIL {phase}: {len(windows)} capture windows, plan has {len(sizes)} sizes")
    for requests, got in zip(sizes, windows, strict=False):
        want = laws(requests, k, vocab, hidden, rank)
        bad = [o for o, (n, b) in want.items() if sorted(got.get(o, [])) != [b] * n]
        head = "FAIL" if bad else "ok"
        parts = ", ".join(f"{o} {len(got.get(o, []))} x {want[o][1]} B" for o in OWNERS)
        out.append(f"{head} {phase} R={requests}: {parts}" + (f" (broken: {bad})" if bad else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("report", type=Path)
    ap.add_argument("draft_config", type=Path)
    ap.add_argument("--phase", action="append", default=[], help="capture / graph_profiling")
    args = ap.parse_args(argv)
    cfg = json.loads(args.draft_config.read_text())
    lines = [
        line
        for phase in args.phase or ["graph_profiling", "capture"]
        for line in check(args.snapshot, args.report, cfg, phase)
    ]
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    raise SystemExit(main())
