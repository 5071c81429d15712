"""Benchmark: memest's analysis of a synthetic 1,000,000-event allocator history.

Prints (never asserts) wall time, peak RSS and, for memest's cases, the peak above the imported
interpreter as a multiple of the input's (uncompressed) size, of:
  1. load_snapshot(memest JSON) + analyze()            target <= 10 s, <= 2 GiB peak RSS
  2. analyze() alone
  3. restricted unpickle + conversion of the same history as a torch pickle
  4. torch's own torch.cuda._memory_viz processing of the same history, for a ratio: trace()
     (a Python replay of every event, the closest counterpart) and trace_plot() (embeds the
     pickle in an HTML page; the browser does the processing). Needs torch (a CPU build is
     enough).

Each case runs in a fresh subprocess so peak RSS is its own.

Usage: python benchmarks/bench_analysis.py [--events 1000000] [--workdir DIR] [--skip-torch]
       python benchmarks/bench_analysis.py --snapshot reports/vllm/raw/call12.L_...snapshot.rank0.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memest.snapshot import dump_snapshot, to_torch
from memest.snapshot.format import FORMAT_NAME, FORMAT_VERSION, Snapshot
from memest.snapshot.tags import StageTag, format_tag

MiB = 1 << 20
STAGES = [
    ("target.piecewise", [8192 - 256 * i for i in range(32)]),
    ("target.full", [512 - 8 * i for i in range(48)]),
    ("draft.step0.piecewise", [8192 - 256 * i for i in range(32)]),
    ("draft.steps.full", [1024 - 16 * i for i in range(64)]),
]
OWNER_FUNCS = [
    ("fp8_fp4_paged_mqa_logits", "vllm/utils/deep_gemm.py"),
    ("as_fp32_logits", "vllm/model_executor/layers/sparse_attn_indexer.py"),
    ("_maybe_add_hidden_state", "vllm/model_executor/models/interfaces.py"),
    ("compute_draft_logits", "vllm/model_executor/models/qwen3_dspark.py"),
    ("_alloc_attn_out", "vllm/models/deepseek_v4/attention.py"),
    ("_allocate_buffers", "vllm/model_executor/layers/fused_moe/modular_kernel.py"),
]


def synthesize(n_events: int, seed: int = 0, segment_rate: float = 0.01) -> Snapshot:
    """A memest snapshot whose events look like a vLLM capture: many stacks, tags, pools."""
    rng = random.Random(seed)
    frames: list[list[Any]] = []
    for i in range(600):
        frames.append([f"vllm/model_executor/layers/mod{i % 60}.py", 10 + i, f"fn_{i}"])
    base = len(frames)
    for name, file in OWNER_FUNCS:
        frames.append([file, 100, name])
    frames.append(["torch/nn/modules/module.py", 1750, "_call_impl"])
    torch_frame = len(frames) - 1
    stacks: list[list[int]] = []
    for s in range(3000):
        depth = rng.randint(12, 30)
        body = [rng.randrange(600) for _ in range(depth)]
        if s % 3 == 0:
            body.insert(0, base + rng.randrange(len(OWNER_FUNCS)))
        stacks.append([torch_frame, *body])
    tags = [""]
    tag_ids: dict[str, int] = {"": 0}
    actions = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"]
    cols: dict[str, list[int]] = {
        k: [] for k in ("action", "addr", "size", "stream", "time_us", "tag", "stack")
    }
    windows: list[dict[str, Any]] = []
    a_act, a_addr, a_size = cols["action"].append, cols["addr"].append, cols["size"].append
    a_stream, a_time, a_tag, a_stack = (
        cols["stream"].append,
        cols["time_us"].append,
        cols["tag"].append,
        cols["stack"].append,
    )
    t = 1_000_000
    next_addr = 0x7F00_0000_0000
    window = 0
    n = 0
    while n < n_events:
        for stage, sizes in STAGES:
            for size in sizes:
                window += 1
                text = format_tag(StageTag("capture", stage, size, "0,1", window))
                tid = tag_ids.setdefault(text, len(tags))
                if tid == len(tags):
                    tags.append(text)
                windows.append(
                    {
                        "kind": "capture",
                        "tag": text,
                        "window": window,
                        "pool": "0,1",
                        "start_us": t,
                        "end_us": t + 1000,
                    }
                )
                live: list[tuple[int, int]] = []
                for _ in range(rng.randint(40, 120)):
                    if n >= n_events:
                        break
                    stack = rng.randrange(len(stacks))
                    nbytes = rng.choice((512, 4096, 65536, 2 * MiB, 16 * MiB))
                    if rng.random() < segment_rate:
                        seg = max(2 * MiB, nbytes)
                        for act, addr, sz in ((3, next_addr, seg), (0, next_addr, nbytes)):
                            a_act(act), a_addr(addr), a_size(sz), a_stream(7), a_time(t)
                            a_tag(tid), a_stack(stack)
                            t += 1
                        n += 2
                    else:
                        a_act(0), a_addr(next_addr), a_size(nbytes), a_stream(7), a_time(t)
                        a_tag(tid), a_stack(stack)
                        n += 1
                        t += 1
                    live.append((next_addr, nbytes))
                    next_addr += nbytes + 512
                    if len(live) > 8 and rng.random() < 0.7:
                        addr, nbytes = live.pop(rng.randrange(len(live)))
                        for act in (1, 2):
                            a_act(act), a_addr(addr), a_size(nbytes), a_stream(7), a_time(t)
                            a_tag(tid), a_stack(-1)
                            t += 1
                        n += 2
                if n >= n_events:
                    break
            if n >= n_events:
                break
    for k in cols:
        del cols[k][n_events:]
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "source": {"synthetic": True, "max_entries": 2 * n_events},
        "frames": frames,
        "stacks": stacks,
        "tags": tags,
        "actions": actions,
        "events": cols,
        "segments": [],
        "windows": windows,
        "phases": [],
    }


_CASES = {
    "memest_load_and_analyze": (
        "from memest.snapshot import load_snapshot\nfrom memest.analysis import analyze\n"
        "s = load_snapshot(PATH_JSON)\nbd = analyze(s)\nresult = len(bd.triggers)\n"
    ),
    "memest_analyze_only": (
        "from memest.snapshot import load_snapshot\nfrom memest.analysis import analyze\n"
        "s = load_snapshot(PATH_JSON)\nt0 = time.perf_counter()\nbd = analyze(s)\n"
        "result = len(bd.triggers)\n"
    ),
    "memest_from_torch_pickle": (
        "from memest.snapshot import load_snapshot\nfrom memest.analysis import analyze\n"
        "s = load_snapshot(PATH_PICKLE)\nbd = analyze(s)\nresult = len(bd.triggers)\n"
    ),
    "torch_memory_viz_trace": (
        "import pickle, torch.cuda._memory_viz as mv\n"
        "data = pickle.load(open(PATH_PICKLE, 'rb'))\nt0 = time.perf_counter()\n"
        "result = len(mv.trace(data))\n"
    ),
    "torch_memory_viz_trace_plot": (
        "import pickle, torch.cuda._memory_viz as mv\n"
        "data = pickle.load(open(PATH_PICKLE, 'rb'))\nt0 = time.perf_counter()\n"
        "result = len(mv.trace_plot(data))\n"
    ),
}

_RUNNER = """
import json, resource, sys, time
PATH_JSON, PATH_PICKLE = sys.argv[1], sys.argv[2]
def _status(key):
    # VmHWM belongs to this process image; ru_maxrss would also count the forking parent.
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import memest.snapshot, memest.analysis.replay  # imported before the baseline: not the input's
base_rss = _status("VmRSS:")
t0 = time.perf_counter()
{body}
dt = time.perf_counter() - t0
print(json.dumps({{"seconds": dt, "peak_rss_bytes": _status("VmHWM:"), "base_rss_bytes": base_rss,
                  "result": result}}))
"""
# The input each case reads: its peak above the baseline (interpreter and memest imported) per
# byte of it is the "x input" figure (the memest JSON counts uncompressed).
_INPUT = {
    "memest_load_and_analyze": "json",
    "memest_analyze_only": "json",
    "memest_from_torch_pickle": "pickle",
}


def run_case(name: str, path_json: Path, path_pickle: Path, timeout_s: float) -> dict[str, Any]:
    code = _RUNNER.format(body=_CASES[name])
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(path_json), str(path_pickle)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:.0f} s"}
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _real(path: Path, timeout_s: float) -> int:
    """One memest case on a real snapshot; its input counts uncompressed."""
    raw = path.read_bytes()
    n_bytes = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
    res = run_case("memest_load_and_analyze", path, path, timeout_s)
    if "error" in res:
        print(f"{path}: {res['error']}")
        return 1
    above = res["peak_rss_bytes"] - res["base_rss_bytes"]
    print(
        f"{path.name}: {n_bytes / MiB:.1f} MiB (uncompressed), {res['seconds']:.2f} s, peak RSS "
        f"{res['peak_rss_bytes'] / MiB:.0f} MiB, {above / MiB:.0f} MiB above imports = "
        f"{above / n_bytes:.2f}x the input"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--segment-rate",
        type=float,
        default=0.01,
        help="share of allocations that reserve a new segment (torch's trace() scans segments)",
    )
    parser.add_argument(
        "--snapshot",
        type=Path,
        default=None,
        help="measure memest_load_and_analyze on this snapshot file instead (a real history)",
    )
    args = parser.parse_args()
    if args.snapshot is not None:
        return _real(args.snapshot, args.timeout)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="memest-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    snap = synthesize(args.events, segment_rate=args.segment_rate)
    path_json = work / "synthetic.memest.json"
    path_pickle = work / "synthetic.torch.pickle"
    dump_snapshot(snap, path_json)
    path_pickle.write_bytes(pickle.dumps(to_torch(snap), protocol=4))
    n_seg = snap["events"]["action"].count(3)
    print(
        f"synthetic history: {args.events} events ({n_seg} segment_alloc), "
        f"{len(snap['stacks'])} stacks, "
        f"{len(snap['tags'])} tags; memest JSON {path_json.stat().st_size / MiB:.0f} MiB, "
        f"torch pickle {path_pickle.stat().st_size / MiB:.0f} MiB "
        f"(built in {time.perf_counter() - t0:.1f} s)"
    )
    del snap
    results: dict[str, dict[str, Any]] = {}
    names = [n for n in _CASES if not (args.skip_torch and n.startswith("torch_"))]
    sizes = {"json": path_json.stat().st_size, "pickle": path_pickle.stat().st_size}
    for name in names:
        res = run_case(name, path_json, path_pickle, args.timeout)
        results[name] = res
        if "error" in res:
            print(f"{name:32s} {res['error']}")
            continue
        line = (
            f"{name:32s} {res['seconds']:8.2f} s   peak RSS {res['peak_rss_bytes'] / MiB:7.0f} MiB"
        )
        if name in _INPUT:
            above = res["peak_rss_bytes"] - res["base_rss_bytes"]
            res["peak_over_input"] = above / sizes[_INPUT[name]]
            line += (
                f"   {above / MiB:6.0f} MiB above imports = {res['peak_over_input']:.2f}x "
                f"its {_INPUT[name]} input"
            )
        print(line)
    base = results.get("memest_analyze_only", {}).get("seconds")
    if base:
        for name in ("torch_memory_viz_trace", "torch_memory_viz_trace_plot"):
            other = results.get(name, {}).get("seconds")
            if other:
                print(f"ratio {name} / memest_analyze_only = {other / base:.2f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
