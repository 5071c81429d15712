#!/usr/bin/env python3
"""Real `vllm serve` on the lent H200: memest's validation matrix, teardown and startup overhead.

One device script. For each start of a group it launches the real `vllm serve` entry point (API
server process + engine-core process; one worker per GPU with --tp N) on the carried pure-Python
vLLM 0.33.0 (.vllm_h200, see shared/vllm-h200), waits for /health, sends one completion of
max_num_batched_tokens - 1 prompt tokens (serving's first full-size step), reads every GPU from
NVML, stops the server with SIGINT and times how long the GPUs take to be free again. One JSON
line per start goes to $OUT/results.jsonl as soon as it ends.

Modes: alone (no memest), enable (MEMEST_ENABLE=1, defaults), lite (MEMEST_ENABLE=1 without
allocator history), apply (MEMEST_ESTIMATE=apply), plan (vLLM alone with
VLLM_ENABLE_STARTUP_PLAN=1 reading the plan an earlier memest start wrote).

A configuration with "batch_step" then sends one request fanned out to max_num_seqs sequences
(all prefilled and sampled in one step, as the profile run's dummy sampler is sized).
usage at the first full-size step = NVML `used` after the completion (the allocator keeps what
the step reserved); budget = ceil(gpu_memory_utilization x CUDA total), CUDA total = NVML total -
NVML reserved (what cudaMemGetInfo reports).

Run on the device from the repo root (carry [".vllm_h200"]):
    NCCL_NVLS_ENABLE=0 OUT=$OUT python3 lab/serve_runs.py --group serve1 --budget-s 560
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python3 lab/X.py`: the repo root
from lab.carry import CARRY, ROOT, launcher, plugin_site  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/memest_serve"))
SITE = Path(tempfile.gettempdir()) / "vllm_h200_site"
PORT = 8011

CONFIGS: dict[str, dict[str, Any]] = {
    "S_llama8b_s128_t4096": {
        "model": "llama8b",
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "tp": 1,
    },
    # tensor parallelism: needs the two-GPU kind (NCCL_NVLS_ENABLE=0, custom all-reduce off)
    "T2_llama8b_s128_t4096_tp2": {
        "model": "llama8b",
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "tp": 2,
    },
    # the same with vLLM's custom all-reduce on (its IPC buffers, memest.estimate.parallel)
    "T2C_llama8b_s128_t4096_tp2_custom_ar": {
        "model": "llama8b",
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "tp": 2,
        "custom_all_reduce": True,
    },
    # `vllm serve`'s defaults: no scheduler flags at all. On an H200 vLLM 0.33.0 then takes
    # max_num_seqs 1024, max_num_batched_tokens 8192, gpu_memory_utilization 0.92 (its log:
    # "The current --gpu-memory-utilization=0.9200") and the model's own max_model_len (8,192).
    "V_llama8b_defaults": {
        "model": "llama8b",
        "max_num_seqs": 1024,
        "mbt": 8192,
        "util": 0.92,
        "tp": 1,
        "max_model_len": 8192,
        "defaults": True,
        "batch_step": True,
    },
}
S = "S_llama8b_s128_t4096"
V = "V_llama8b_defaults"
T2 = "T2_llama8b_s128_t4096_tp2"
T2C = "T2C_llama8b_s128_t4096_tp2_custom_ar"
GROUPS: dict[str, list[tuple[str, str]]] = {
    # the matrix, then alternating warm starts for the overhead (alone / enable / lite)
    "serve1": [
        (S, "apply"),
        (S, "alone"),
        (S, "plan"),
        (S, "enable"),
        (S, "lite"),
        (S, "alone"),
        (S, "enable"),
    ],
    "tp2": [(T2, "apply"), (T2, "alone"), (T2, "plan")],
    # custom all-reduce on, then off and on again with vLLM alone (the term's difference)
    "tp2_custom_ar": [(T2C, "apply"), (T2C, "alone"), (T2C, "plan"), (T2, "alone"), (T2C, "alone")],
    # Startup overhead of the plugin's defaults: one start to fill the compile cache, then
    # alternating warm starts; "overhead_warm" goes on with a cache already filled.
    "overhead": [(S, "alone"), *[(S, "enable"), (S, "alone")] * 5],
    "overhead_warm": [(S, "enable"), (S, "alone")] * 5,
    # the matrix again on a fresh machine: memest apply (it compiles), its plan, vLLM alone
    "matrix": [(S, "apply"), (S, "plan"), (S, "alone")],
    # vllm serve's defaults: memest apply (it compiles), its plan, vLLM alone
    "defaults": [(V, "apply"), (V, "plan"), (V, "alone")],
    # the same with a full-batch step after the first full-size step: memest apply, vLLM alone
    # (call 25 ran its apply start with a full-batch step at temperature 1.0 and no other option)
    "defaults2": [(V, "apply"), (V, "alone")],
}
UTIL_LINE = re.compile(r"The current --gpu-memory-utilization=([0-9.]+)")
INIT_LINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)")


# --------------------------------------------------------------------------- GPU readings
class Gpus:
    """NVML memory of every GPU (used / total / reserved bytes); no CUDA context is created."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    def read(self) -> list[dict[str, int]]:
        out = []
        for h in self.handles:
            try:
                m = self.nvml.nvmlDeviceGetMemoryInfo(h, version=self.nvml.nvmlMemory_v2)
                out.append(
                    {"used": int(m.used), "total": int(m.total), "reserved": int(m.reserved)}
                )
            except Exception:  # older binding: v1 (used includes reserved)
                m = self.nvml.nvmlDeviceGetMemoryInfo(h)
                out.append({"used": int(m.used), "total": int(m.total), "reserved": 0})
        return out

    def wait_free(self, baseline: list[dict[str, int]], limit_s: float) -> float | None:
        """Seconds until every GPU is back within 256 MiB of its baseline (None: not in time)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            now = self.read()
            if all(
                n["used"] <= b["used"] + (256 << 20) for n, b in zip(now, baseline, strict=True)
            ):
                return round(time.monotonic() - t0, 2)
            time.sleep(0.1)
        return None


# --------------------------------------------------------------------------- one start
def _env(cfg_name: str, mode: str) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(ROOT), str(ROOT / "instrumentation"), str(plugin_site())]
        + [env.get("PYTHONPATH", "")]
    )
    env["NCCL_NVLS_ENABLE"] = "0"
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["MEMEST_OUTPUT_DIR"] = str(OUT / "memest")
    env["MEMEST_RUN_ID"] = f"{cfg_name}.{mode}.{int(time.time())}"
    for key in ("MEMEST_ENABLE", "MEMEST_ESTIMATE", "VLLM_ENABLE_STARTUP_PLAN"):
        env.pop(key, None)
    if mode in ("enable", "lite", "apply"):
        env["MEMEST_ENABLE"] = "1"
    if mode == "apply":
        env["MEMEST_ESTIMATE"] = "apply"
    if mode == "lite":
        env["MEMEST_HISTORY_MAX_ENTRIES"] = "0"
    if mode == "plan":
        env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
    return env


def _command(cfg: dict[str, Any]) -> list[str]:
    native = ["native"]
    kernel = {
        "ir_op_priority": {
            "rms_norm": native,
            "fused_add_rms_norm": native,
            "gelu_and_mul_sparse": native,
        }
    }
    model = str(CARRY / "models" / cfg["model"])
    return [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
        "--load-format", "dummy", "--skip-tokenizer-init",
        "--attention-backend", "TRITON_ATTN",
        "--compilation-config", json.dumps({"custom_ops": ["none"]}),
        "--kernel-config", json.dumps(kernel),
    ] + _scheduler_flags(cfg) + [
        "--tensor-parallel-size", str(cfg["tp"]),
        *([] if cfg.get("custom_all_reduce") else ["--disable-custom-all-reduce"]),
        "--host", "127.0.0.1", "--port", str(PORT), "--seed", "0",
    ]  # fmt: skip


def _scheduler_flags(cfg: dict[str, Any]) -> list[str]:
    """The scheduler and memory flags; none for a configuration that takes vLLM's defaults."""
    if cfg.get("defaults"):
        return []
    return [
        "--max-model-len", str(cfg.get("max_model_len", 4096)),
        "--max-num-seqs", str(cfg["max_num_seqs"]),
        "--max-num-batched-tokens", str(cfg["mbt"]),
        "--gpu-memory-utilization", str(cfg["util"]),
    ]  # fmt: skip


def _ready(proc: subprocess.Popen[bytes], wait_s: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


def _first_full_step(cfg: dict[str, Any]) -> dict[str, Any]:
    n = min(cfg["mbt"], cfg.get("max_model_len", 4096)) - 1
    body = {
        "model": str(CARRY / "models" / cfg["model"]),
        "prompt": [(7 * i) % 30000 + 10 for i in range(n)],
        "max_tokens": 1,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    return {"step_tokens": n, **_complete(body, "completion_status", "step_error")}


def _complete(body: dict[str, Any], status_key: str, error_key: str) -> dict[str, Any]:
    """POST one completion; {status_key: HTTP status} or {error_key: what went wrong}."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return {status_key: r.status}
    except Exception as exc:
        return {error_key: repr(exc)[:300]}


def _full_batch_step(cfg: dict[str, Any]) -> dict[str, Any]:
    """One request fanned out to max_num_seqs sequences (n), short enough that all of them
    prefill in one step: the step samples max_num_seqs rows at once, as vLLM's profile run's
    dummy sampler does (a first full-size step of one request samples one row), with the
    sampling options of vLLM 0.33.0's SamplingParams.for_sampler_warmup (the profile run's
    second sampler pass: the float32 logits pipeline, top-k/top-p/min-p, penalties, logprobs)
    that the completions API takes."""
    body = {
        "model": str(CARRY / "models" / cfg["model"]),
        "prompt": [11, 12, 13, 14, 15, 16, 17],
        "max_tokens": 2,
        "min_tokens": 2,
        "n": cfg["max_num_seqs"],
        "temperature": 0.9,
        "top_p": 0.9,
        "top_k": 50,
        "min_p": 0.1,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
        "repetition_penalty": 1.2,
        "logit_bias": {"0": -1.0, "1": 0.5},
        "logprobs": 5,
        "prompt_logprobs": 1,
        "return_tokens_as_token_ids": True,  # the server has no tokenizer to name them
        "seed": 0,
        "ignore_eos": True,
    }
    return {
        "batch_step_seqs": cfg["max_num_seqs"],
        **_complete(body, "batch_step_status", "batch_step_error"),
    }


def _stop(proc: subprocess.Popen[bytes], gpus: Gpus, baseline: list[dict[str, int]]) -> dict:
    """SIGINT to the server's process group; time the exit and the GPUs' release."""
    t0 = time.monotonic()
    out: dict[str, Any] = {}
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    freed = gpus.wait_free(baseline, 60)
    out["teardown_gpu_free_s"] = freed
    try:
        proc.wait(timeout=max(1.0, 60 - (time.monotonic() - t0)))
        out["teardown_exit_s"] = round(time.monotonic() - t0, 2)
    except subprocess.TimeoutExpired:
        out["teardown_exit_s"] = None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    out["gpu_after_teardown"] = gpus.read()
    if freed is None:  # whatever is still held once the server is gone
        out["teardown_gpu_free_after_kill_s"] = gpus.wait_free(baseline, 30)
    return out


def _reports(run_id: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((OUT / "memest" / run_id).glob("report.rank*.json")):
        rep = json.loads(path.read_text())
        est = rep.get("estimate") or {}
        found.append(
            {
                "path": str(path.relative_to(OUT)),
                "rank": rep.get("rank"),
                "memest_end_used_bytes": _end_used(rep),
                "available_kv_cache_bytes": (rep.get("vllm") or {}).get("available_kv_cache_bytes"),
                "num_gpu_blocks": (rep.get("vllm") or {}).get("num_gpu_blocks"),
                "estimate_components": est.get("components"),
                "hook_errors": rep.get("hook_errors"),
                "timing_notes": [
                    n for n in rep.get("notes", []) if "own work" in n or "warm profile pass" in n
                ],
            }
        )
    return found


def _end_used(rep: dict[str, Any]) -> int | None:
    for p in rep.get("phases", []):
        if p.get("name") == "end":
            return p["end"].get("device_used_bytes")
    return None


def one_start(cfg_name: str, mode: str, gpus: Gpus, wait_s: float) -> dict[str, Any]:
    cfg = CONFIGS[cfg_name]
    env = _env(cfg_name, mode)
    baseline = gpus.read()
    log_path = OUT / "starts" / f"{cfg_name}.{mode}.{int(time.time())}.log"
    rec: dict[str, Any] = {
        "config": cfg_name,
        "mode": mode,
        "launcher": "vllm serve",
        "tensor_parallel_size": cfg["tp"],
        "architecture": _architecture(cfg["model"]),
        "util": cfg["util"],
        "run_id": env["MEMEST_RUN_ID"],
        "gpu_before": baseline,
    }
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _command(cfg), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        ready = _ready(proc, wait_s)
        rec["ready"] = ready
        rec["ready_s"] = round(time.monotonic() - t0, 2)
        rec["gpu_at_ready"] = gpus.read()
        if ready:
            rec.update(_first_full_step(cfg))
            rec["gpu_after_step"] = gpus.read()
            if cfg.get("batch_step"):
                rec.update(_full_batch_step(cfg))
                rec["gpu_after_batch_step"] = gpus.read()
        rec.update(_stop(proc, gpus, baseline))
    text = log_path.read_text(errors="replace")
    m = INIT_LINE.search(text)
    rec["engine_init_s"] = float(m.group(1)) if m else None
    rec["vllm_util"] = logged_util(text)
    rec["log"] = str(log_path.relative_to(OUT))
    if not ready:
        rec["log_tail"] = text[-3000:]
    rec["memest_reports"] = _reports(env["MEMEST_RUN_ID"])
    usage(rec)
    return rec


def _architecture(model: str) -> str:
    cfg = json.loads((CARRY / "models" / model / "config.json").read_text())
    return str((cfg.get("architectures") or ["?"])[0])


def logged_util(log_text: str) -> float | None:
    """The gpu_memory_utilization vLLM says it used (its default when the flag is not given)."""
    m = UTIL_LINE.search(log_text)
    return float(m.group(1)) if m else None


def usage(rec: dict[str, Any]) -> None:
    """Per GPU: usage at the first full-size step minus ceil(util x CUDA total), util as vLLM
    logged it (else the configuration's)."""
    after = rec.get("gpu_after_step")
    if not after or rec.get("step_error"):
        return
    batch = rec.get("gpu_after_batch_step")
    if batch and not rec.get("batch_step_error"):  # the allocator keeps what both steps reserved
        after = [max(a, b, key=lambda g: g["used"]) for a, b in zip(after, batch, strict=True)]
    rows = []
    for g in after:
        total = g["total"] - g["reserved"]
        budget = math.ceil((rec.get("vllm_util") or rec["util"]) * total)
        rows.append(
            {"usage_bytes": g["used"], "budget_bytes": budget, "umb_bytes": g["used"] - budget}
        )
    rec["per_gpu"] = rows


def run_group(group: str, budget_s: float, wait_s: float) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "starts").mkdir(exist_ok=True)
    carried = launcher()
    carried.set_env()
    carried.prepare_site(str(CARRY), str(SITE))
    gpus = Gpus()
    t_begin = time.monotonic()
    for cfg_name, mode in GROUPS[group]:
        left = budget_s - (time.monotonic() - t_begin)
        if left < 75:
            print(f"SKIP {cfg_name}/{mode}: {left:.0f}s left", flush=True)
            continue
        rec = one_start(cfg_name, mode, gpus, min(wait_s, left - 30))
        with open(OUT / "results.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        umb = [round(g["umb_bytes"] / 2**30, 3) for g in rec.get("per_gpu", [])]
        print(
            f"DONE {cfg_name}/{mode} ready={rec['ready']} {rec['ready_s']}s "
            f"init={rec['engine_init_s']} umb_gib={umb} free_s={rec['teardown_gpu_free_s']} "
            f"exit_s={rec['teardown_exit_s']} reports={len(rec['memest_reports'])}",
            flush=True,
        )
    plans = Path(tempfile.gettempdir()) / "vllm_h200_cache" / "startup_plan"
    for p in sorted(plans.glob("*.json")) if plans.exists() else []:
        (OUT / "plans").mkdir(exist_ok=True)
        (OUT / "plans" / p.name).write_text(p.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", default="serve1", choices=sorted(GROUPS))
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--wait-s", type=float, default=240)
    args = ap.parse_args()
    run_group(args.group, args.budget_s, args.wait_s)


if __name__ == "__main__":
    main()
