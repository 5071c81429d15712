#!/usr/bin/env python3
"""Why serving's first full-size step outgrew memest's activation term on the MoE and MLA starts.

M (Qwen3-MoE 8 layers, call 14): the step's allocator history (torch pickle) and the start's memest
history (which holds the warm profile pass) are replayed through memest's allocator model
(memest.estimate.allocsim), from the allocator state each started from:

- the step from the end-of-init state (the step pickle's segments without those the step added);
- the warm pass's own request sequence from the same end-of-init state, and from an empty cache;
- each again without the requests the lab's torch stand-ins for `_moe_C` make (the CUDA kernels
  write into the caller's buffers and allocate nothing).

L (DeepSeek-V2-Lite 8 layers, call 12; no step history): vLLM's profile pass runs the model
without attention metadata, so MLA's forward_impl allocates a stand-in of the chunked-prefill
workspace and returns; the step runs the prefill backend. The CPU SDPA backend's tensors for one
prompt are sized here from the config.

    PYTHONPATH=. .venv/bin/python lab/step_replay.py     # writes reports/vllm/step_gap.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memest.estimate.allocsim import PoolSim
from memest.snapshot import Snapshot, load_snapshot

HERE = Path(__file__).resolve().parents[1] / "reports" / "vllm"
RAW = HERE / "raw"
M_START = "M_qwen3moe8l_s64_t2048.apply-hist-cold-stephist"
M_STEP = RAW / "call14-logs" / f"{M_START}.step.pickle"
M_HISTORY = RAW / f"call14.{M_START}.snapshot.rank0.json.gz"
M_RECORD = RAW / "results.call14.jsonl"
L_RECORD = RAW / "results.call12.jsonl"
DEFAULT_POOL = "0,0"
STANDIN_FILE = "vllm_op_standins.py"
MiB = 1 << 20


# --------------------------------------------------------------------------- replay (M)
def _action(snap: Snapshot, i: int) -> str:
    return str(snap["actions"][snap["events"]["action"][i]])


def _is_standin(snap: Snapshot, i: int) -> bool:
    """The request was made by a lab stand-in (its innermost two frames)."""
    stack = snap["events"]["stack"][i]
    if stack < 0:
        return False
    return any(STANDIN_FILE in snap["frames"][f][0] for f in snap["stacks"][stack][:2])


def _phase_window(snap: Snapshot, phase: str) -> dict[str, Any]:
    tag = f"memest/1;phase={phase}"
    return next(w for w in snap["windows"] if w["kind"] == "phase" and w["tag"] == tag)


def warm_pass_events(history: Snapshot) -> list[int]:
    """Events of the warm profile pass: after graph profiling, before initialize_from_config."""
    lo = _phase_window(history, "graph_profiling.total")["end_us"]
    hi = _phase_window(history, "initialize_from_config")["start_us"]
    times = history["events"]["time_us"]
    return [i for i, t in enumerate(times) if lo < t < hi]


def end_of_init_state(step: Snapshot) -> PoolSim:
    """The default pool as the step found it: the dump's segments less those the step added.

    Every request of the step is freed again by the dump, so the older segments' blocks are
    as they were before it (freed blocks merge back).
    """
    ev = step["events"]
    added = {ev["addr"][i] for i in range(len(ev["action"])) if _action(step, i) == "segment_alloc"}
    sim = PoolSim()
    for seg in step["segments"]:
        if seg["pool"] != DEFAULT_POOL or seg["address"] in added:
            continue
        blocks = [(b["address"], b["size"], b["state"] != "inactive") for b in seg["blocks"]]
        sim.seed_segment(blocks, stream=seg["stream"], small=seg["segment_type"] == "small")
    return sim


def replay(snap: Snapshot, events: list[int], sim: PoolSim, *, standins: bool) -> dict[str, Any]:
    """Feed the requests (alloc / free_completed) to ``sim``; the segments it had to add."""
    ev = snap["events"]
    dropped: set[int] = set()
    live = peak = 0
    sizes: dict[int, int] = {}
    for i in events:
        kind, addr = _action(snap, i), ev["addr"][i]
        if kind == "alloc":
            if not standins and _is_standin(snap, i):
                dropped.add(addr)
                continue
            sim.alloc(addr, ev["size"][i], ev["stream"][i], i)
            sizes[addr] = ev["size"][i]
            live += ev["size"][i]
            peak = max(peak, live)
        elif kind == "free_completed":
            if addr in dropped:
                dropped.discard(addr)
                continue
            sim.free(addr)
            live -= sizes.pop(addr, 0)
    result = sim.result()
    return {
        "reserved_bytes": result.reserved_bytes,
        "segments_mib": [s // MiB for s in result.segments],
        "allocated_peak_bytes": peak,
    }


def measured_segments(snap: Snapshot, events: list[int]) -> list[int]:
    ev = snap["events"]
    return [ev["size"][i] // MiB for i in events if _action(snap, i) == "segment_alloc"]


def _record(path: Path, config: str, mode: str) -> dict[str, Any]:
    for line in path.read_text().splitlines():
        rec: dict[str, Any] = json.loads(line)
        if rec.get("config") == config and rec.get("mode") == mode:
            return rec
    raise KeyError(f"{config}/{mode} not in {path.name}")


def moe_replay() -> dict[str, Any]:
    step, history = load_snapshot(M_STEP), load_snapshot(M_HISTORY)
    step_events = list(range(len(step["events"]["action"])))
    warm_events = warm_pass_events(history)
    out: dict[str, Any] = {
        "measured": {
            "step_segments_mib": measured_segments(step, step_events),
            "warm_segments_mib": measured_segments(history, warm_events),
        }
    }
    free = sum(size for _, size, _ in end_of_init_state(step).free_blocks())
    out["end_of_init_default_pool_free_bytes"] = free
    for standins in (True, False):
        key = "with_standins" if standins else "without_standins"
        out[key] = {
            "step_from_end_of_init": replay(
                step, step_events, end_of_init_state(step), **_s(standins)
            ),
            "warm_from_end_of_init": replay(
                history, warm_events, end_of_init_state(step), **_s(standins)
            ),
            "warm_from_empty": replay(history, warm_events, PoolSim(), **_s(standins)),
        }
    out["would_have_been"] = _would_have_been(out)
    return out


def _s(standins: bool) -> dict[str, bool]:
    return {"standins": standins}


def _would_have_been(out: dict[str, Any]) -> dict[str, int]:
    """usage - budget of the apply start had the real `_moe_C` kernels run (replayed, not measured).

    The start's measured term and step move by what the replay says dropping the stand-ins'
    requests does to each: the term by the warm pass's change from an empty cache, the step by
    its change from the end-of-init state. KV shrinks or grows by the term's change.
    """
    rec = _record(M_RECORD, "M_qwen3moe8l_s64_t2048", "apply-hist-cold-stephist")
    term = int(rec["memest_figures"]["profile_headroom_bytes"])
    step = int(rec["step_reserved_growth_bytes"])
    measured = int(rec["step_usage_minus_budget_bytes"])
    w, wo = out["with_standins"], out["without_standins"]
    term_real = (
        term + wo["warm_from_empty"]["reserved_bytes"] - w["warm_from_empty"]["reserved_bytes"]
    )
    step_real = wo["step_from_end_of_init"]["reserved_bytes"]
    return {
        "measured_usage_minus_budget_bytes": measured,
        "measured_term_bytes": term,
        "measured_step_growth_bytes": step,
        "term_without_standins_bytes": term_real,
        "step_without_standins_bytes": step_real,
        "usage_minus_budget_without_standins_bytes": measured
        - (step - step_real)
        - (term_real - term),
    }


# --------------------------------------------------------------------------- arithmetic (L)
def cpu_sdpa_prefill(tokens: int, heads: int, qk_dim: int, v_dim: int) -> dict[str, int]:
    """Bytes CPUSDPAMLAPrefillBackend._ragged_sdpa allocates for one prompt of ``tokens``.

    q, k, v are cast to float32 per request ([H, T, d]); the scores matmul and its scaled copy
    are [H, T, T] float32 (the first freed once scaled), the softmax's probabilities another
    while the scaled scores stay referenced: two live at a time; a [T, T] bool causal mask; the
    output in float32, then bf16. Peak: at the output's cast, scores + probabilities + q, k, v +
    mask + output in float32 and bf16.
    """
    scores = heads * tokens * tokens * 4
    qk = heads * tokens * qk_dim * 4
    v = heads * tokens * v_dim * 4
    mask = tokens * tokens
    out32 = heads * tokens * v_dim * 4
    out16 = heads * tokens * v_dim * 2
    peak = 2 * scores + 2 * qk + v + mask + out32 + out16
    return {"scores": scores, "q_or_k_f32": qk, "v_f32": v, "mask": mask, "peak": peak}


def mla_forward_mha(tokens: int, heads: int, nope: int, rope: int, v_dim: int) -> int:
    """bf16 tensors forward_mha makes before any backend: kv_b_proj's [T, H, nope + v] output
    and k = cat(k_nope, k_pe) [T, H, nope + rope]; the profile pass skips both."""
    return tokens * heads * (nope + v_dim) * 2 + tokens * heads * (nope + rope) * 2


def profile_dummy(
    max_model_len: int, max_num_seqs: int, block_size: int, heads: int, nope: int, v_dim: int
) -> int:
    """The bf16 [workspace rows, H, nope + v] tensor MLA's forward_impl allocates when it has no
    attention metadata (vLLM's profile pass); rows = min(max(8 x max_model_len, 4 x max_num_seqs
    x block_size), 64 Ki), rounded up to the block size."""
    rows = min(max(8 * max_model_len, 4 * max_num_seqs * block_size), 64 * 1024)
    rows = -(-rows // block_size) * block_size
    return rows * heads * (nope + v_dim) * 2


def mla_arithmetic() -> dict[str, Any]:
    cfg = json.loads(
        (HERE.parents[1] / "lab" / "models" / "dsv2lite_8l" / "config.json").read_text()
    )
    rec = _record(L_RECORD, "L_dsv2lite8l_s64_t2048", "apply-hist")
    tokens = int(rec["step_tokens"])  # call 12's harness served min(mbt, max_model_len - 1)
    heads, nope, rope, v_dim = (
        int(cfg["num_attention_heads"]),
        int(cfg["qk_nope_head_dim"]),
        int(cfg["qk_rope_head_dim"]),
        int(cfg["v_head_dim"]),
    )
    sdpa = cpu_sdpa_prefill(tokens, heads, nope + rope, v_dim)
    mha = mla_forward_mha(tokens, heads, nope, rope, v_dim)
    # max_model_len 4096 and max_num_seqs 64: CONFIGS in lab/vllm_runs.py
    dummy = profile_dummy(4096, 64, int(rec["block_size"]), heads, nope, v_dim)
    # FlashAttention's prefill (mla/prefill/flash_attn.py), at most: v padded to the qk head
    # size (FA2), an output of that size, the lse
    flash_out = 2 * tokens * heads * (nope + rope) * 2 + heads * tokens * 4
    term = int(rec["memest_figures"]["profile_headroom_bytes"])
    step = int(rec["step_reserved_growth_bytes"])
    return {
        "tokens": tokens,
        "cpu_sdpa": sdpa,
        "forward_mha_bytes": mha,
        "profile_dummy_bytes": dummy,
        "step_needs_beyond_profile_bytes": sdpa["peak"] + mha - dummy,
        "measured_term_bytes": term,
        "measured_step_growth_bytes": step,
        "measured_gap_bytes": step - term,
        "measured_usage_minus_budget_bytes": int(rec["step_usage_minus_budget_bytes"]),
        "flash_attn_needs_beyond_profile_bytes": mha + flash_out - dummy,
    }


def _lines(result: dict[str, Any]) -> Iterator[str]:
    m = result["M"]
    for key in ("with_standins", "without_standins"):
        for name, r in m[key].items():
            yield f"M {key:16} {name:22} {r['reserved_bytes'] / MiB:6.0f} MiB {r['segments_mib']}"
    yield f"M measured step {m['measured']['step_segments_mib']} warm {m['measured']['warm_segments_mib']}"
    yield f"M would have been: {m['would_have_been']}"
    yield f"L: {result['L']}"


def main() -> None:
    result = {"M": moe_replay(), "L": mla_arithmetic()}
    (HERE / "step_gap.json").write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write("\n".join(_lines(result)) + "\n")


if __name__ == "__main__":
    main()
