#!/usr/bin/env python3
"""Owners under torch.compile: how much of a start's capture is named, and each owner's size law.

For each start (a run folder of ``lab/vllm_runs.py --group owners``: report.rank0.json and
snapshot.rank0.json.gz, or a raw pair ``reports/vllm/raw/<run>`` naming
``<run>.report.rank0.json`` and ``<run>.snapshot.rank0.json.gz``) it prints, in markdown:

- the share of capture-phase pool growth (trigger rows) and of retained bytes charged to named
  owners (not ``compiled_piece*``, not ``unattributed:*``), re-analysing the kept history with the
  map of generated code it carries;
- per owner and capture stage: the live peak beside a size formula from the model's config
  (bytes per token x the stage's widest capture size in tokens, from the report's vLLM 0.33.0
  capture plan; draft.* stages use the drafter's config; a fixed size where the owner has one),
  and their ratio (about the number of such buffers alive at once: 1, 2, ... — a ratio far from
  an integer means the formula or the owner is wrong);
- with ``--same A B`` (repeatable): whether two starts of one configuration (cold compile and
  compile-cache hit) give the same owner table;
- with ``--compile-cache RUN=PATH[,GRAPH_DIR]``: RUN's generated code without a module map (compiled
  in a start without memest) gets the map the plugin now rebuilds at the end of init, from the
  ``computation_graph.py`` of vLLM's compile cache at PATH (a folder or a .tgz of one; only under a
  path holding GRAPH_DIR) and the generated modules there (memest.analysis.fxgraph).

Usage (after a device run; nothing here needs a GPU):
    python lab/owner_table.py OUT/memest/A_llama8b_s128_t4096.enable-cold=CONFIG.json ... \
        [--same RUN_A RUN_B] [--compile-cache RUN=CACHE.tgz] > reports/vllm/owners/owners.md
``CONFIG.json`` is the model's Hugging Face config (lab/models/*/config.json, or the carried
Llama-8B's); ``RUN=TARGET.json,DRAFTER.json`` for a start with a drafter.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tarfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memest.analysis import OwnerRules, analyze  # noqa: E402
from memest.analysis.fxgraph import GRAPH_FILE, match_piece, parse_split_graph  # noqa: E402
from memest.analysis.inductor import attach_nodes, generated_key, listed_names  # noqa: E402
from memest.estimate.indexer import decode_indexer_logits  # noqa: E402
from memest.reporters.owners import owner_label  # noqa: E402
from memest.schema import Breakdown, CompiledCode, RunReport  # noqa: E402
from memest.snapshot import load_snapshot, scrub_path  # noqa: E402
from memest.units import fmt_bytes as format_bytes  # noqa: E402

UNNAMED = ("compiled_piece", "unattributed")
BF16 = 2
#: torch's default cuBLAS workspace on sm90 (CUBLAS_WORKSPACE_CONFIG ":4096:8": 8 x 4096 KiB).
CUBLAS_WORKSPACE_SM90 = 8 * 4096 * 1024
PLAN_SIZING = "vllm-0.33.0"
#: Where lab/vllm_runs.py puts vLLM on the device (frames there are scrubbed from this root,
#: as the plugin scrubs live frames from sys.path).
DEVICE_SITE = "/tmp/vllm_h200_site"


def per_token_bytes(cfg: dict[str, Any]) -> dict[str, int]:
    """Bytes per token of each owner's buffer, from a Hugging Face config (BF16 activations)."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("intermediate_size") or 0)
    eagle3 = any("Eagle3" in a for a in cfg.get("architectures", []))
    laws = {
        "qkv_proj": (heads + 2 * kv_heads) * head_dim * BF16,
        "qk_norm_rope": (heads + kv_heads) * head_dim * BF16,
        "attn_output": heads * head_dim * BF16,
        "o_proj": hidden * BF16,
        "norm": hidden * BF16,
        "residual": hidden * BF16,
        "embedding": hidden * BF16,
        "aux_hidden_states": hidden * BF16,
        "graph_output": hidden * BF16,
        "eagle3_fc": hidden * BF16,
        # EAGLE3's first layer reads [norm(embeds), norm(hidden)]: twice the hidden size
        "qkv_input": (2 if eagle3 else 1) * hidden * BF16,
        "logits": int(cfg["vocab_size"]) * BF16,
        "draft_logits": int(cfg.get("draft_vocab_size") or cfg["vocab_size"]) * BF16,
        "draft_sample_hidden": hidden * BF16,
    }
    if inter and not cfg.get("num_experts"):  # dense MLP (an MoE layer's experts are fused_moe)
        laws |= {
            "mlp_gate_up": 2 * inter * BF16,
            "mlp_act": inter * BF16,
            "mlp_down": hidden * BF16,
        }
    if cfg.get("num_experts"):
        laws["moe_router_logits"] = int(cfg["num_experts"]) * BF16
    return laws


def per_request_bytes(cfg: dict[str, Any]) -> dict[str, int]:
    """Bytes per request of the drafter's owners sized by requests, not tokens.

    An EAGLE-style drafter samples one row per request in each step: draft_logits is requests x
    vocabulary. DSpark (a ``markov_rank``) computes its base logits over all K positions at once
    (requests x K = the block's tokens: the per-token law) and then, once per draft step, one
    row per request (lab/dspark_logits_law.py derives these from vLLM's code).
    """
    vocab = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
    if not cfg.get("markov_rank"):
        return {"draft_logits": vocab * BF16}
    return {
        "draft_logits.step": vocab * BF16,
        "draft_logits.markov_bias": vocab * BF16,
        "draft_markov_embed": int(cfg["markov_rank"]) * BF16,
    }


def indexer_row_bytes(report: RunReport) -> dict[str, int]:
    """Bytes per decode row of the DSA indexer's logits in a FULL graph (one row per request
    and query token): max_model_len positions, memest.estimate.indexer's law."""
    mml, k = report.config.max_model_len or 0, report.config.num_speculative_tokens or 0
    bf16, fp32 = decode_indexer_logits(1, k, mml, BF16), decode_indexer_logits(1, k, mml, 4)
    per_row = 1 + k
    return {
        "indexer_logits_bf16": bf16.kernel_bytes // per_row,
        "indexer_logits_fp32": bf16.fp32_copy_bytes // per_row,
        "indexer_logits_fp32_kernel": fp32.kernel_bytes // per_row,
    }


#: Owners whose size does not follow the token count: (bytes, where the figure comes from).
FIXED = {"cublas_workspace": (CUBLAS_WORKSPACE_SM90, "torch sm90 default")}


def named(owner: str) -> bool:
    return not owner.startswith(UNNAMED)


def shares(bd: Breakdown) -> dict[str, tuple[int, int]]:
    """(named bytes, all bytes) of capture-phase pool growth and of retained bytes."""
    out = {}
    for view, rows in (
        ("pool growth", [(t.owner, t.bytes) for t in bd.triggers if t.phase == "capture"]),
        ("retained", [(r.owner, r.bytes) for r in bd.retained if r.phase == "capture"]),
    ):
        out[view] = (sum(b for o, b in rows if named(o)), sum(b for _, b in rows))
    return out


def run_files(spec: Path) -> tuple[Path, Path]:
    """(report, snapshot) of a run folder, or of a raw pair ``reports/vllm/raw/<run>``."""
    if spec.is_dir():
        return spec / "report.rank0.json", spec / "snapshot.rank0.json.gz"
    return (
        spec.with_name(spec.name + ".report.rank0.json"),
        spec.with_name(spec.name + ".snapshot.rank0.json.gz"),
    )


def cache_texts(path: Path, graph_dir: str = "") -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(computation_graph.py files, generated modules by key) of a vLLM compile cache: a folder
    or a .tgz of one; only graphs under a folder whose path holds ``graph_dir``."""
    texts: dict[str, str] = {}
    if path.is_dir():
        for p in path.rglob("*.py"):
            texts[str(p.relative_to(path))] = p.read_text(errors="replace")
    else:
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.isfile() and m.name.endswith(".py") else None
                if f is not None:
                    texts[m.name] = f.read().decode(errors="replace")
    graphs = sorted(
        (name, t) for name, t in texts.items() if name.endswith(GRAPH_FILE) and graph_dir in name
    )
    generated = {k: t for name, t in texts.items() if (k := generated_key(name)) is not None}
    return graphs, generated


def rebuilt_code(code: CompiledCode, cache: str) -> CompiledCode:
    """``code`` with each map-less module's node map rebuilt from a compile cache (the plugin's
    rebuild, memest.analysis.fxgraph): ``cache`` is ``PATH[,GRAPH_DIR]``."""
    path, _, graph_dir = cache.partition(",")
    graphs, generated = cache_texts(Path(path), graph_dir)
    scrub = functools.partial(scrub_path, roots=[DEVICE_SITE])
    pieces = [p for name, text in graphs for p in parse_split_graph(text, name, scrub)]
    out = code.model_copy(deep=True)
    for f in out.files:
        if f.nodes:
            continue
        text = generated.get(f.key)
        names = listed_names(text) if text else [n for s in f.sites for n in s.nodes]
        piece = match_piece(names, pieces)
        if piece is not None:
            attach_nodes(f, piece.nodes)
    return out


def breakdown_of(run: Path, cache: str = "") -> tuple[RunReport, Breakdown]:
    report_path, snap_path = run_files(run)
    report = RunReport.model_validate_json(report_path.read_text())
    if snap_path.is_file():
        snap = load_snapshot(snap_path)
        if cache and snap.get("compiled_code"):
            code = rebuilt_code(CompiledCode.model_validate(snap["compiled_code"]), cache)
            return report, analyze(snap, rules=OwnerRules.default().with_compiled(code))
        return report, analyze(snap)
    if report.breakdown is None:
        raise SystemExit(f"{run}: no breakdown and no kept history")
    return report, report.breakdown


def widest_tokens(report: RunReport, bd: Breakdown) -> dict[str, int]:
    """Widest capture size in tokens of each stage (runner), from the start's capture plan;
    a stage the plan does not list: the widest size its capture tags carry."""
    plans = [p for p in report.capture_plans if p.sizing == PLAN_SIZING] or report.capture_plans
    out = {s.stage: max(s.capture_sizes) for s in bd.stages if s.capture_sizes}
    out |= {r.runner: r.widest_tokens for p in plans[:1] for r in p.runners if r.widest_tokens}
    return out


def widest_requests(report: RunReport) -> dict[str, int]:
    """Widest capture size in requests of each stage: the plan's, else as many requests as the
    widest graph's tokens allow within max_num_seqs."""
    plans = [p for p in report.capture_plans if p.sizing == PLAN_SIZING] or report.capture_plans
    seqs = report.config.max_num_seqs
    return {
        r.runner: r.widest_requests or min(seqs, r.widest_tokens)
        for p in plans[:1]
        for r in p.runners
        if r.widest_requests or r.widest_tokens
    }


def owner_table(bd: Breakdown) -> dict[str, int]:
    """Capture-phase trigger bytes per owner (the table a cold and a warm start must share)."""
    out: dict[str, int] = defaultdict(int)
    for t in bd.triggers:
        if t.phase == "capture":
            out[t.owner] += t.bytes
    return dict(sorted(out.items()))


def formula_rows(
    report: RunReport, bd: Breakdown, cfg: dict[str, Any], drafter: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each large owner's capture live peak beside its size formula (stage by stage)."""
    widest, requests = widest_tokens(report, bd), widest_requests(report)
    laws = {"target": per_token_bytes(cfg) if cfg else {}}
    laws["draft"] = per_token_bytes(drafter) if drafter else laws["target"]
    step_laws = per_request_bytes(drafter) if drafter else {}
    rows = []
    for p in sorted(bd.live_peaks, key=lambda p: (p.stage, -p.peak_bytes)):
        if p.phase != "capture" or p.peak_bytes < (1 << 20):
            continue
        per_tok = laws.get(p.stage.split(".", 1)[0], {}).get(p.owner)
        if p.stage == "target.full" and cfg.get("index_topk"):
            per_tok = indexer_row_bytes(report).get(p.owner, per_tok)
        tokens = widest.get(p.stage)
        formula, basis = None, ""
        per_req, nreq = step_laws.get(p.owner), requests.get(p.stage)
        if p.stage.startswith("draft") and per_req and nreq:
            formula, basis = per_req * nreq, f"{per_req} B x {nreq} requests"
        elif per_tok and tokens:
            formula, basis = per_tok * tokens, f"{per_tok} B x {tokens} tokens"
        elif p.owner in FIXED:
            formula, basis = FIXED[p.owner][0], FIXED[p.owner][1]
        rows.append(
            {
                "stage": p.stage,
                "owner": p.owner,
                "peak": p.peak_bytes,
                "formula": formula,
                "basis": basis,
                "ratio": p.peak_bytes / formula if formula else None,
            }
        )
    return rows


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f} %" if d else "-"


def print_start(
    name: str, report: RunReport, bd: Breakdown, cfg: dict[str, Any], drafter: dict[str, Any]
) -> None:
    sh = shares(bd)
    (tn, tt), (rn, rt) = sh["pool growth"], sh["retained"]
    print(f"\n## {name} ({report.model})\n")
    print(
        f"capture pool growth charged to named owners: {format_bytes(tn)} of "
        f"{format_bytes(tt)} ({_pct(tn, tt)}); retained: "
        f"{format_bytes(rn)} of {format_bytes(rt)} ({_pct(rn, rt)})\n"
    )
    unnamed = sorted({t.owner for t in bd.triggers if t.phase == "capture" and not named(t.owner)})
    unnamed += sorted(
        {r.owner for r in bd.retained if r.phase == "capture" and not named(r.owner)} - set(unnamed)
    )
    for owner in unnamed:
        print(f"- unnamed: `{owner}`: {owner_label(owner)}")
    if unnamed:
        print()
    print("| stage | owner | live peak | formula | = | peak/formula |")
    print("|---|---|---:|---|---:|---:|")
    for r in formula_rows(report, bd, cfg, drafter):
        formula = format_bytes(r["formula"]) if r["formula"] else ""
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else ""
        print(
            f"| {r['stage']} | {r['owner']} | {format_bytes(r['peak'])} | {r['basis']} | "
            f"{formula} | {ratio} |"
        )


def _config(text: str) -> dict[str, Any]:
    return json.loads(Path(text).read_text()) if text else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="RUN=MODEL_CONFIG.json[,DRAFTER_CONFIG.json]")
    ap.add_argument(
        "--same",
        nargs=2,
        action="append",
        default=[],
        metavar="RUN",
        help="two runs whose owner tables match (repeatable)",
    )
    ap.add_argument(
        "--compile-cache",
        action="append",
        default=[],
        metavar="RUN=PATH[,GRAPH_DIR]",
        help="rebuild RUN's missing module maps from this vLLM compile cache (a folder or a "
        ".tgz; only computation_graph.py under a path holding GRAPH_DIR), as the plugin does",
    )
    args = ap.parse_args(argv)
    caches = dict(c.partition("=")[::2] for c in args.compile_cache)
    tables: dict[str, dict[str, int]] = {}
    starts = []
    for spec in args.runs:
        run_text, _, cfg_text = spec.partition("=")
        target_cfg, _, drafter_cfg = cfg_text.partition(",")
        run = Path(run_text)
        report, bd = breakdown_of(run, caches.get(run_text, ""))
        tables[run.name] = owner_table(bd)
        starts.append((run.name, report, bd, _config(target_cfg), _config(drafter_cfg)))
    print("| start | capture pool growth named | retained named |")
    print("|---|---:|---:|")
    for name, _, bd, _, _ in starts:
        sh = shares(bd)
        print(f"| {name} | {_pct(*sh['pool growth'])} | {_pct(*sh['retained'])} |")
    for start in starts:
        print_start(*start)
    failed = 0
    for pair in args.same:
        a, b = (Path(x).name for x in pair)
        same = tables.get(a) == tables.get(b)
        print(f"\ncold {a} and warm {b}: owner tables {'identical' if same else 'DIFFER'}")
        if not same:
            print(json.dumps({a: tables.get(a), b: tables.get(b)}, indent=1))
            failed = 1
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
