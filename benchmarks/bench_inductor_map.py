#!/usr/bin/env python3
"""Cost of the compiled-code map (memest_instrumentation.vllm.inductor) on a real torch.compile.

A Llama-like model of ``--layers`` layers (the blocks of
tests/unit/instrumentation_vllm/inductor_block.py) is compiled by Inductor on CPU the way vLLM
compiles, one ``standalone_compile`` per piece (a graph break between layers gives one FX graph
per layer, as vLLM's piecewise split does). Each start runs in a fresh process with an empty
Inductor cache (a cold compile) or with the cache a cold start filled (a warm start: Inductor
loads its generated modules from the FX graph cache), and either plain or with every compile
wrapped in ``record_graph`` as the plugin wraps vLLM's compiler adaptors.

Prints (never asserts), median over ``--repeat`` starts of each kind:
  - compile seconds (the first forward: Dynamo, Inductor, the C++ builds), plain and wrapped;
  - memest's own seconds inside the compiles (graph read, modules-loaded check, node map and
    its file), as the plugin's work budget counts them, and the wall time record_graph adds
    around the compiles it wraps;
  - the end-of-init gathering (``collect()``: read and parse every generated module loaded,
    attach the node maps) and the size of the resulting ``compiled_code`` JSON.

Usage: python benchmarks/bench_inductor_map.py [--layers 8] [--repeat 3] [--workdir DIR]
Needs torch (a CPU build is enough) and a C++ compiler for Inductor's CPU kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOCK_DIR = ROOT / "tests" / "unit" / "instrumentation_vllm"


def child(mode: str, layers: int, out: Path) -> None:
    """One start: compile the model (plain or wrapped), time it, gather the map, write JSON."""
    sys.path.insert(0, str(BLOCK_DIR))
    import torch
    from inductor_block import HEADS, HIDDEN, TOKENS, VOCAB, Layer, RMSNorm  # type: ignore
    from memest_instrumentation.vllm import inductor
    from memest_instrumentation.vllm.state import state
    from torch import nn
    from torch._inductor import standalone_compile

    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])
            self.norm = RMSNorm(HIDDEN)
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
                torch._dynamo.graph_break()  # one piece per layer, as vLLM splits
            return self.lm_head(self.norm(x))

    def compile_piece(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return standalone_compile(
            gm, example_inputs, dynamic_shapes="from_example_inputs", options={}
        )

    around = {"wrapper_s": 0.0, "inner_s": 0.0}

    def timed_piece(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        t = time.perf_counter()
        try:
            return compile_piece(gm, example_inputs)
        finally:
            around["inner_s"] += time.perf_counter() - t

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if mode == "plain":
            return compile_piece(gm, example_inputs)
        t = time.perf_counter()
        try:
            return inductor.record_graph(gm, lambda: timed_piece(gm, example_inputs))
        finally:
            around["wrapper_s"] += time.perf_counter() - t

    torch.manual_seed(0)
    model = Deep()
    ids = torch.randint(0, VOCAB, (TOKENS,))
    cos, sin = torch.randn(TOKENS, 1, HIDDEN // HEADS), torch.randn(TOKENS, 1, HIDDEN // HEADS)
    if mode == "wrapped":
        state()  # the plugin's state exists long before vLLM compiles (plugin load)
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend=backend)(ids, cos, sin)
    compile_s = time.perf_counter() - t0
    result: dict[str, Any] = {"compile_s": compile_s, "pieces": len(inductor.loaded_modules())}
    if mode == "wrapped":
        result["record_s"] = state().work_s.get("compiled_code", 0.0)
        result["around_s"] = around["wrapper_s"] - around["inner_s"]
        t0 = time.perf_counter()
        code = inductor.collect()
        result["collect_s"] = time.perf_counter() - t0
        result["files"] = len(code.files) if code else 0
        result["sites"] = sum(len(f.sites) for f in code.files) if code else 0
        result["named_nodes"] = sum(len(f.nodes) for f in code.files) if code else 0
        result["json_bytes"] = len(code.model_dump_json()) if code else 0
        result["hook_errors"] = state().hook_errors
    out.write_text(json.dumps(result))


def _start(mode: str, layers: int, cache: Path, maps: Path, out: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "MEMEST_CODE_MAP_DIR": str(maps),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "instrumentation")]),
    }
    subprocess.run(
        [sys.executable, __file__, "--child", mode, "--layers", str(layers), "--out", str(out)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--child", choices=("plain", "wrapped"), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.layers, args.out)
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_inductor_map."))
    runs: dict[str, list[dict[str, Any]]] = {}
    for i in range(args.repeat):
        for mode in ("plain", "wrapped"):  # alternate, so drift hits both alike
            cache, maps = work / f"{mode}{i}" / "inductor", work / f"{mode}{i}" / "maps"
            for kind in ("cold", "warm"):  # warm: the same cache, filled by the cold start
                out = work / f"{mode}{i}.{kind}.json"
                runs.setdefault(f"{mode}.{kind}", []).append(
                    _start(mode, args.layers, cache, maps, out)
                )
    print(f"torch.compile of a {args.layers}-layer Llama-like model on CPU, one piece per layer")
    print(f"median of {args.repeat} starts each, fresh process per start (workdir {work})\n")
    print(
        f"{'start':<6} {'plain s':>8} {'wrapped s':>10} {'ratio':>6} "
        f"{'memest in compile s':>20} {'around compile s':>17} {'collect s':>10}   "
        "spread of compile s (min-max)"
    )
    for kind in ("cold", "warm"):
        plain, wrapped = runs[f"plain.{kind}"], runs[f"wrapped.{kind}"]
        p, w = _median(plain, "compile_s"), _median(wrapped, "compile_s")
        spread = " / ".join(
            f"{min(r['compile_s'] for r in rows):.2f}-{max(r['compile_s'] for r in rows):.2f}"
            for rows in (plain, wrapped)
        )
        print(
            f"{kind:<6} {p:>8.2f} {w:>10.2f} {w / p:>6.3f} "
            f"{_median(wrapped, 'record_s'):>20.4f} {_median(wrapped, 'around_s'):>17.4f} "
            f"{_median(wrapped, 'collect_s'):>10.4f}   "
            f"plain / wrapped {spread}"
        )
    print(
        "(memest in compile: memest's work budget's count; around compile: wall time of\n"
        " record_graph less the compile it wraps, everything the wrapping adds; compare the\n"
        " plain/wrapped ratio with the spread of compile times)"
    )
    last = runs["wrapped.warm"][-1]
    print(
        f"\ngenerated modules loaded: {last['pieces']} (wrappers and kernels); map: "
        f"{last['files']} wrapper files, {last['sites']} allocation sites, "
        f"{last['named_nodes']} source nodes, {last['json_bytes']:,} bytes of JSON; "
        f"hook errors: {last['hook_errors'] or 'none'}"
    )
    same = all(
        r["files"] == last["files"] and r["sites"] == last["sites"] for r in runs["wrapped.cold"]
    )
    print(f"cold and warm starts map the same sites: {same}")


if __name__ == "__main__":
    main()
