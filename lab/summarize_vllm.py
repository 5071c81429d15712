#!/usr/bin/env python3
"""Turn the H200 start records (raw/results.call*.jsonl) into validation.json.

One record per configuration and estimator, each with usage_minus_budget_bytes and kv_tokens.
usage = device memory in use at the end of init (total - cudaMemGetInfo free after gc +
empty_cache) + the profile run's activation peak (vLLM's transient_peak_headroom), which vLLM
keeps inside the budget for serving's transients. A plan start skips profiling, so it takes the
smallest peak measured for the same configuration (same call when it has one): the warm peak, without the
torch.compile transients of a call's first start, which serving never needs again.

From call 5 on, every start also served one request of max_num_batched_tokens prompt tokens
right after init (serving's first full-size step) and read the reservation it added:
``usage_kind`` "first full-size step" records use usage = in use at the end of init + that
growth, measured in the start itself; that is the figure the issue's target is judged on for
those calls. Earlier calls keep the definition above ("end of init + activation peak").
vLLM 0.34.0 starts with its growable KV cache measured at serving's peak also carry what its
sizing kept free (``growable_transient_kept_bytes``, ``growable_margin_bytes``) and
``margin_left_unused_bytes``: budget - usage at serving's peak, the memory it kept free that
serving never used (vLLM alone: its margin's waste; memest apply: memest's).
From call 15 on, a step over cached context follows (17 requests sharing a cached prefix that
fills one MLA chunked-prefill workspace chunk): usage is the larger of the two steps, both kept.

"enable" starts (MEMEST_ENABLE=1, MEMEST_ESTIMATE=plan) are sized by vLLM's own estimator, so
they count as vLLM records measured with memest on ("vllm+memest-measuring").

The "memest-apply-replayed" rows are not starts: they recompute the apply-mode budget of the
same apply start with the corrected outside-PyTorch term (what the profiling graphs hold until
teardown instead of the growth over the profiling capture), from that start's own readings
(raw/<config>.apply.report.rank0.json), and shift its measured usage by the whole KV blocks the
corrected budget adds.

    python3 lab/summarize_vllm.py      # writes reports/vllm/validation.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python3 lab/X.py`: the repo root
from lab.vllm_runs import CONFIGS  # noqa: E402
from memest.vllm_versions import resolve_version  # noqa: E402

HERE = Path(__file__).resolve().parents[1] / "reports" / "vllm"
RAW = HERE / "raw"
GiB = 1 << 30
ESTIMATOR = {
    "alone": "vllm",
    "enable": "vllm+memest-measuring",
    "apply": "memest-apply",
    "plan": "memest-plan",
    "plandiag": "memest-plan (MEMEST_ENABLE=1 measuring)",
    "default": "vllm+memest-measuring",
    "lite": "vllm+memest-measuring",
}
# Mode suffixes of lab/vllm_runs.py: how a start was made beyond its mode.
VARIANT = {
    "cold": "cold: empty compile cache",
    "old": "the memest tree before the stall fix (git 1bf6c41)",
    "hist": "allocator history kept (MEMEST_KEEP_SNAPSHOT=1)",
    "stephist": "the first full-size step's allocator history kept",
    "memest": "plugin on, measuring only: the plan path's profile run under vLLM's split limit",
}
# Calls whose apply starts ran before the outside-PyTorch term was corrected.
REPLAYED_CALLS = ("call1", "call2")
# Calls whose plugin lost its profile_run hook to the harness's own wrapper (its signature was
# hidden), so apply and plans ran without the activation term: diagnostic, not validation.
DIAGNOSTIC_CALLS = ("call4",)
# Starts whose serving steps ran a lab stand-in that allocates what no GPU deployment does:
# (call, configuration) -> why. Diagnostic, not validation.
DIAGNOSTIC_STARTS = {
    **{
        (call, "M_qwen3moe8l_s64_t2048"): "the stand-in moe_sum made a float32 copy of its "
        "input (128 MiB per layer) that vLLM's kernel does not"
        for call in ("call12", "call14")
    },
    **{
        (call, "L_dsv2lite8l_s64_t2048"): "MLA prefill on the CPU SDPA backend (float32 score "
        "matrices), which no GPU deployment selects"
        for call in ("call12", "call14")
    },
    ("call44", "G_gemma3_6l_s128_t4096"): "the lab read a hybrid's KV as blocks x every "
    "layer's page (736 GB on a 141 GiB device) before it read vLLM's KV-cache tensors; vLLM "
    "allocated 122.7 GB",
}


def load() -> list[dict]:
    rows = []
    for path in sorted(RAW.glob("results.call*.jsonl")):
        call = path.stem.split(".")[-1]
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                mbt = CONFIGS[rec["config"]]["mbt"] if rec["config"] in CONFIGS else None
                rows.append({**rec, "call": call, "config_mbt": mbt})
    return rows


def plan_budgets(rows: list[dict]) -> dict[tuple[str, str, int], int]:
    """The budget each startup plan was made for, by (call, configuration, its KV bytes): the
    requested memory of the start that wrote it. A plan start loads the plan's KV size and is
    held to that budget, not to its own gpu_memory_utilization's (on vLLM 0.34 the plan start
    runs without the growable cache, whose 1.0 default the writing start had: 0.92 otherwise)."""
    out: dict[tuple[str, str, int], int] = {}
    for r in rows:
        plan = r.get("memest_plan") or {}
        if plan.get("kv_cache_memory_bytes") and r.get("requested_bytes"):
            out[(r["call"], r["config"], plan["kv_cache_memory_bytes"])] = r["requested_bytes"]
    return out


def main() -> None:
    rows = load()
    planned = plan_budgets(rows)
    warm: dict[tuple[str, str], int] = {}
    for r in rows:
        h = r.get("headroom_bytes")
        if h is not None:
            key = (r["call"], r["config"])
            warm[key] = min(warm.get(key, h), h)
    out = []
    for r in rows:
        if r.get("launcher") == "vllm serve":
            out.extend(serve_records(r))
            continue
        mode, *flags = r["mode"].split("-")
        if mode not in ESTIMATOR or "persistent_used_bytes" not in r:
            continue
        h = r.get("headroom_bytes")
        source = "this start"
        if h is None:
            same_call = warm.get((r["call"], r["config"]))
            if same_call is not None:
                h, source = same_call, "smallest (warm) peak of the configuration, same call"
            else:
                h = min(v for (_, cfg), v in warm.items() if cfg == r["config"])
                source = "smallest (warm) peak of the configuration, earlier call"
        budget = r["requested_bytes"]  # vLLM's ceil(gpu_memory_utilization x total)
        given = r.get("kv_cache_memory_bytes_given")
        if mode == "plan" and given:
            budget = planned.get((r["call"], r["config"], given), budget)
        usage = r["persistent_used_bytes"] + h
        usage_kind = "end of init + activation peak"
        if r.get("step_usage_bytes") is not None:
            usage = r["step_usage_bytes"]
            usage_kind = "first full-size step"
            h = r["step_reserved_growth_bytes"] + r["step_outside_growth_bytes"]
            source = "first full-size step of this start (reservation it added)"
        if r.get("context_step_usage_bytes") is not None:
            # from call 15 on: then a step over cached context; serving's peak is the larger
            usage = max(usage, r["context_step_usage_bytes"])
            usage_kind = "serving's peak: first full-size step, then a step over cached context"
        if r.get("batch_step_usage_bytes") is not None:
            # from call 44 on: then a full-batch step with the sampler-warmup options
            usage = max(usage, r["batch_step_usage_bytes"])
            usage_kind = (
                "serving's peak: first full-size step, a step over cached context, "
                "a full-batch step with vLLM's sampler-warmup options"
            )
        rec = {
            "configuration": r["config"],
            "call": r["call"],
            "estimator": ESTIMATOR[mode],
            "variant": "; ".join(VARIANT[f] for f in flags) or None,
            "launcher": "LLM",
            "tensor_parallel_size": 1,
            "architecture": architecture(r["config"]),
            "rank": 0,
            "usage_minus_budget_bytes": usage - budget,
            "usage_minus_budget_gib": round((usage - budget) / GiB, 3),
            "kv_tokens": r["kv_tokens"],
            "kv_bytes": r["kv_bytes"],
            "budget_bytes": budget,
            "in_use_end_of_init_bytes": r["persistent_used_bytes"],
            "activation_peak_bytes": h,
            "activation_peak_from": source,
            "usage_kind": usage_kind,
            "start_s": r["start_s"],
            "vllm_cudagraph_estimate_bytes": r.get("vllm_cudagraph_estimate_bytes"),
            "kv_cache_memory_bytes_given": r.get("kv_cache_memory_bytes_given"),
            "kind": "start"
            if r["call"] not in DIAGNOSTIC_CALLS
            else "start (diagnostic: memest's profile_run hook was not installed)",
        }
        failed = [k for k in ("step", "context_step", "batch_step") if r.get(f"{k}_error")]
        if failed:  # the engine stopped: that step's need is unknown, serving did not hold
            rec["failed_steps"] = {k: r[f"{k}_error"] for k in failed}
            rec["kind"] = "start (a serving step failed: " + ", ".join(failed) + ")"
        for kind in ("step", "context_step", "batch_step"):
            if r.get(f"{kind}_usage_bytes") is not None:
                rec[f"{kind}_usage_minus_budget_bytes"] = r[f"{kind}_usage_bytes"] - budget
        if r.get("vllm_version"):
            rec["vllm_version"] = r["vllm_version"]
        if r.get("gpu_memory_utilization") is not None:
            rec["gpu_memory_utilization"] = r["gpu_memory_utilization"]
        groups = (r.get("kv_groups") or {}).get("groups") or []
        if len(groups) > 1:  # a hybrid: vLLM's own token count, its groups share one buffer
            rec["kv_groups"] = groups
            tokens, concurrency = vllm_kv_line(r)
            rec["kv_tokens"], rec["max_concurrency"] = tokens, concurrency
            kvg = r["kv_groups"]  # every KV tensor aliases one buffer (call 44 recorded the sum)
            rec["kv_bytes"] = kvg["tensor_bytes"] // max(kvg["tensors"], 1)
        if r.get("context_step_context_tokens") is not None:
            rec["context_step_context_tokens"] = r["context_step_context_tokens"]
        if usage_kind.startswith("serving's peak"):
            rec.update(growable_margin(r, usage, budget))
        if (r["call"], r["config"]) in DIAGNOSTIC_STARTS:
            rec["kind"] = f"start (diagnostic: {DIAGNOSTIC_STARTS[(r['call'], r['config'])]})"
        short = r.get("step_tokens") is not None and r["step_tokens"] < r["config_mbt"] - 1
        if short:
            rec["kind"] = (
                f"start (diagnostic: its step held {r['step_tokens']} of "
                f"{r['config_mbt'] - 1} tokens, not a full-size step)"
            )
        out.append(rec)
        if mode == "apply" and r["call"] in REPLAYED_CALLS:
            out.append(replay(r, rec))
    (HERE / "validation.json").write_text(json.dumps(out, indent=1) + "\n")
    for rec in out:
        print(  # noqa: T201
            f"{rec['call']:6s} {rec['launcher']:10s} {rec['configuration']:34s} "
            f"{rec['estimator']:22s} {rec['usage_minus_budget_gib']:+.3f} GiB  "
            f"kv_tokens {rec['kv_tokens'] or 0:,} {rec.get('variant') or ''}"
        )


def growable_margin(r: dict, usage: int, budget: int) -> dict:
    """vLLM 0.34's growable KV cache of a start measured at serving's peak: what its sizing
    kept free (the larger of its measured transient peak and torch's reservation growth, and
    vLLM's margin, ExtensibleKV.margin_bytes) and the margin left unused, budget - usage at
    serving's peak: memory the sizing kept free that serving's peak never used (at vLLM's
    default utilization of 1.0 the budget is the whole GPU). Empty for any other start."""
    ext = r.get("extensible_kv_cache")
    if not ext or r.get("vllm_version") != "0.34.0":
        return {}
    kv = resolve_version("0.34.0").extensible_kv
    assert kv is not None
    transient = int(ext["reserved_headroom_bytes"])
    unused = budget - usage
    return {
        "growable_transient_kept_bytes": max(transient, int(ext["torch_reserve_growth_bytes"])),
        "growable_margin_bytes": kv.margin_bytes(transient),
        "margin_left_unused_bytes": unused,
        "margin_left_unused_gib": round(unused / GiB, 3),
    }


def architecture(config: str) -> str:
    """The config's architectures[0]: the lab's own shapes keep their config.json in the repo;
    the rest are the carried Llama-3-8B shape (and its EAGLE3 drafter)."""
    model = Path(CONFIGS[config]["model"]) if config in CONFIGS else None
    if model is not None and (model / "config.json").is_file():
        return str(json.loads((model / "config.json").read_text())["architectures"][0])
    return "LlamaForCausalLM"


_KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(
    r"GPU KV cache size: ([\d,]+) tokens, Maximum concurrency for [\d,]+ tokens per request: "
    r"([\d.]+)x"
)


def vllm_kv_line(r: dict) -> tuple[int | None, float | None]:
    """KV tokens and maximum concurrency from vLLM's own log line of an LLM() start."""
    log = RAW / f"{r['call']}-logs" / f"{r['config']}.{r['mode']}.log"
    found = _CONCURRENCY.findall(log.read_text(errors="replace")) if log.is_file() else []
    if not found:
        return None, None
    return int(found[-1][0].replace(",", "")), float(found[-1][1])


def serve_kv(r: dict) -> tuple[int | None, int | None]:
    """KV tokens as vLLM's own log of the start states them, and their bytes at the model's
    per-token KV size (from the call's memest report of the same configuration)."""
    log = RAW / f"{r['call']}-logs" / Path(r["log"]).name
    found = _KV_LINE.findall(log.read_text(errors="replace")) if log.is_file() else []
    if not found:
        return None, None
    tokens = int(found[-1].replace(",", ""))
    spec = None
    for path in sorted(RAW.glob(f"{r['call']}.{r['config']}.*.report.rank0.json")):
        spec = json.loads(path.read_text()).get("kv_cache") or spec
    if spec is None:
        return tokens, None
    return tokens, tokens // spec["block_size"] * spec["page_size_bytes"]


def serve_records(r: dict) -> list[dict]:
    """One record per GPU of a `vllm serve` start (lab/serve_runs.py), usage read by NVML."""
    out = []
    reports = {rep.get("rank"): rep for rep in r.get("memest_reports") or []}
    kv_tokens, kv_bytes = serve_kv(r)
    for rank, g in enumerate(r.get("per_gpu") or []):
        at_ready = r["gpu_at_ready"][rank]["used"]
        out.append(
            {
                "configuration": r["config"],
                "call": r["call"],
                "estimator": ESTIMATOR[r["mode"]],
                "variant": "MEMEST_HISTORY_MAX_ENTRIES=0" if r["mode"] == "lite" else None,
                "launcher": "vllm serve",
                "tensor_parallel_size": r["tensor_parallel_size"],
                "architecture": r["architecture"],
                "rank": rank,
                "usage_minus_budget_bytes": g["umb_bytes"],
                "usage_minus_budget_gib": round(g["umb_bytes"] / GiB, 3),
                "kv_tokens": kv_tokens,
                "kv_bytes": kv_bytes,
                "budget_bytes": g["budget_bytes"],
                "usage_bytes": g["usage_bytes"],
                "usage_kind": (
                    "larger of the first full-size step and a full-batch step (max_num_seqs "
                    "sequences sampled at once), NVML used on the GPU"
                    if r.get("gpu_after_batch_step") and not r.get("batch_step_error")
                    else "first full-size step, NVML used on the GPU"
                ),
                "nvml_used_at_ready_bytes": at_ready,
                "memest_end_of_init_used_bytes": reports.get(rank, {}).get("memest_end_used_bytes"),
                "step_added_bytes": g["usage_bytes"] - at_ready,
                "engine_init_s": r.get("engine_init_s"),
                "ready_s": r.get("ready_s"),
                "teardown_gpu_free_s": r.get("teardown_gpu_free_s"),
                "kind": "start",
            }
        )
    return out


def replay(r: dict, rec: dict) -> dict:
    report = json.loads((RAW / f"{r['config']}.apply.report.rank0.json").read_text())
    comps = report["estimate"]["components"]
    phases = {p["name"]: p for p in report["phases"]}
    gp_end = phases["graph_profiling"]["end"]
    now = phases["determine_available_memory"]["end"]
    held = max(
        (gp_end["device_used_bytes"] - gp_end["torch_reserved_bytes"])
        - (now["device_used_bytes"] - now["torch_reserved_bytes"]),
        0,
    )
    growth = comps["capture_outside_torch_bytes"]  # what that start subtracted
    kv_fixed = comps["memest_kv_bytes"] + growth - held
    page = r["kv_page_bytes_all_layers"]
    blocks = kv_fixed // page
    delta = (blocks - r["num_gpu_blocks"]) * page
    return {
        **rec,
        "estimator": "memest-apply-replayed",
        "usage_minus_budget_bytes": rec["usage_minus_budget_bytes"] + delta,
        "usage_minus_budget_gib": round((rec["usage_minus_budget_bytes"] + delta) / GiB, 3),
        "kv_tokens": blocks * r["block_size"],
        "kv_bytes": blocks * page,
        "kind": "replayed from the apply start's readings with the corrected outside-PyTorch "
        f"term ({growth} B growth over the profiling capture replaced by {held} B held until "
        "teardown); not a new start",
    }


if __name__ == "__main__":
    main()
