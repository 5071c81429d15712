#!/usr/bin/env python3
"""Owners under torch.compile: how much of a start's capture is named, and each owner's size law.

For each start (a run folder of ``lab/vllm_runs.py --group owners``: report.rank0.json and
snapshot.rank0.json.gz) it prints, in markdown:

- the share of capture-phase pool growth (trigger rows) and of retained bytes charged to named
  owners (not ``compiled_piece*``, not ``unattributed:*``), re-analysing the kept history with the
  map of generated code it carries;
- per owner and capture stage: the live peak beside a size formula from the model's config
  (bytes per token x the stage's widest capture size), and their ratio (about the number of such
  buffers alive at once: 1, 2, ... — a ratio far from an integer means the formula or the owner
  is wrong);
- with ``--same A B``: whether two starts of one configuration (cold compile and compile-cache
  hit) give the same owner table.

Usage (after a device run; nothing here needs a GPU):
    python lab/owner_table.py OUT/memest/A_llama8b_s128_t4096.enable-cold=CONFIG.json ... \
        [--same RUN_A RUN_B] > reports/vllm/owners/owners.md
``CONFIG.json`` is the model's Hugging Face config (lab/models/*/config.json, or the carried
Llama-8B's). This script has not run on device data yet.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memest.analysis import analyze  # noqa: E402
from memest.schema import Breakdown, RunReport  # noqa: E402
from memest.snapshot import load_snapshot  # noqa: E402
from memest.units import fmt_bytes as format_bytes  # noqa: E402

UNNAMED = ("compiled_piece", "unattributed")
BF16 = 2


def per_token_bytes(cfg: dict[str, Any]) -> dict[str, int]:
    """Bytes per token of each owner's buffer, from a Hugging Face config (BF16 activations)."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    if not cfg.get("num_experts"):
        inter = int(cfg["intermediate_size"])
    return {
        "qkv_proj": (heads + 2 * kv_heads) * head_dim * BF16,
        "qk_norm_rope": (heads + kv_heads) * head_dim * BF16,
        "attn_output": heads * head_dim * BF16,
        "o_proj": hidden * BF16,
        "mlp_gate_up": 2 * inter * BF16,
        "mlp_act": inter * BF16,
        "mlp_down": hidden * BF16,
        "norm": hidden * BF16,
        "residual": hidden * BF16,
        "embedding": hidden * BF16,
        "aux_hidden_states": hidden * BF16,
        "eagle3_fc": hidden * BF16,
        "logits": int(cfg["vocab_size"]) * BF16,
        "draft_logits": int(cfg["vocab_size"]) * BF16,
        "moe_router_logits": int(cfg.get("num_experts") or 0) * BF16,
    }


def named(owner: str) -> bool:
    return not owner.startswith(UNNAMED)


def _share(rows: list[tuple[str, int]]) -> tuple[int, int]:
    total = sum(b for _, b in rows)
    return sum(b for o, b in rows if named(o)), total


def breakdown_of(run: Path) -> tuple[RunReport, Breakdown]:
    report = RunReport.model_validate_json((run / "report.rank0.json").read_text())
    snap_path = run / "snapshot.rank0.json.gz"
    if snap_path.is_file():
        return report, analyze(load_snapshot(snap_path))
    if report.breakdown is None:
        raise SystemExit(f"{run}: no breakdown and no kept history")
    return report, report.breakdown


def owner_table(bd: Breakdown) -> dict[str, int]:
    """Capture-phase trigger bytes per owner (the table a cold and a warm start must share)."""
    out: dict[str, int] = defaultdict(int)
    for t in bd.triggers:
        if t.phase == "capture":
            out[t.owner] += t.bytes
    return dict(sorted(out.items()))


def print_start(name: str, report: RunReport, bd: Breakdown, cfg: dict[str, Any]) -> None:
    trig = [(t.owner, t.bytes) for t in bd.triggers if t.phase == "capture"]
    ret = [(r.owner, r.bytes) for r in bd.retained if r.phase == "capture"]
    (tn, tt), (rn, rt) = _share(trig), _share(ret)
    print(f"\n## {name} ({report.model})\n")
    print(
        f"capture pool growth charged to named owners: {format_bytes(tn)} of "
        f"{format_bytes(tt)} ({100 * tn / tt if tt else 0:.1f} %); retained: "
        f"{format_bytes(rn)} of {format_bytes(rt)} ({100 * rn / rt if rt else 0:.1f} %)\n"
    )
    widest = {s.stage: max(s.capture_sizes) for s in bd.stages if s.capture_sizes}
    laws = per_token_bytes(cfg)
    print("| stage | owner | live peak | bytes/token | widest tokens | formula | peak/formula |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for p in sorted(bd.live_peaks, key=lambda p: (p.stage, -p.peak_bytes)):
        if p.phase != "capture" or p.peak_bytes < (1 << 20):
            continue
        per_tok, tokens = laws.get(p.owner), widest.get(p.stage)
        formula = per_tok * tokens if per_tok and tokens else None
        ratio = f"{p.peak_bytes / formula:.2f}" if formula else ""
        print(
            f"| {p.stage} | {p.owner} | {format_bytes(p.peak_bytes)} | {per_tok or ''} | "
            f"{tokens or ''} | {format_bytes(formula) if formula else ''} | {ratio} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="RUN_DIR=MODEL_CONFIG.json")
    ap.add_argument("--same", nargs=2, metavar="RUN", help="two runs whose owner tables match")
    args = ap.parse_args(argv)
    tables: dict[str, dict[str, int]] = {}
    for spec in args.runs:
        run_text, _, cfg_text = spec.partition("=")
        run = Path(run_text)
        cfg = json.loads(Path(cfg_text).read_text()) if cfg_text else {}
        report, bd = breakdown_of(run)
        tables[run.name] = owner_table(bd)
        print_start(run.name, report, bd, cfg)
    if args.same:
        a, b = (Path(x).name for x in args.same)
        same = tables.get(a) == tables.get(b)
        print(f"\ncold {a} and warm {b}: owner tables {'identical' if same else 'DIFFER'}")
        if not same:
            print(json.dumps({a: tables.get(a), b: tables.get(b)}, indent=1))
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
