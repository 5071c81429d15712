"""Node maps rebuilt from vLLM's compile cache (memest.analysis.fxgraph), on real H200 data.

The cache is call 23's (reports/vllm/raw/call23-cache): vLLM's ``computation_graph.py`` of the
Llama-8B shape and three generated modules it loaded, copied gzipped to
tests/data/inductor/cachehit. The ground truth is the map call 11's cold memest start recorded from
the live FX graph for the same three generated modules (its report, copied to tests/data/starts).
"""

from __future__ import annotations

import functools
import gzip
import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from memest.analysis import OwnerRules, analyze
from memest.analysis.fxgraph import GraphPiece, match_piece, param_module, parse_split_graph
from memest.analysis.inductor import attach_nodes, listed_names, parse_generated
from memest.schema import CompiledCode, CompiledFile
from memest.snapshot import load_snapshot, scrub_path

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "inductor" / "cachehit"
COLD = ROOT / "tests/data/starts/call11.A_llama8b_s128_t4096.enable-cold.report.rank0.json"
HIT = ROOT / "reports" / "vllm" / "owners" / "call23.A_llama8b_s128_t4096.enable"
COLD_RUN = ROOT / "reports" / "vllm" / "owners" / "call11.A_llama8b_s128_t4096.enable-cold"
LAST = "4m/c4mozpcpzaepjhpkg4bjwcn3236672fyhxgvwxgbzlv3hvgrdkf7.py"
FIRST = "j2/cj2ltahmbhex47g2iwk5li6pdrhnagh7ad7hhf6rbrttnp5ks3ze.py"
MIDDLE = "o5/co5zvqoerdwxfmyqgwlgrp3rnnvzylcndopyfes7hupvmnctwzfs.py"
DEVICE_SITE = "/tmp/vllm_h200_site"  # where lab/vllm_runs.py put vLLM on the device


def _text(name: str) -> str:
    return gzip.decompress((DATA / f"{name}.gz").read_bytes()).decode()


@cache
def _pieces() -> list[GraphPiece]:
    scrub = functools.partial(scrub_path, roots=[DEVICE_SITE])
    return parse_split_graph(_text("computation_graph.py"), "computation_graph.py", scrub)


@cache
def _truth() -> dict[str, Any]:
    report = json.loads(COLD.read_text())
    return {f["key"]: f for f in report["compiled_code"]["files"]}


def _rebuilt(key: str) -> CompiledFile:
    text = _text(Path(key).name)
    piece = match_piece(listed_names(text), _pieces())
    assert piece is not None
    file = parse_generated(text, key)
    attach_nodes(file, piece.nodes)
    return file


def test_placeholder_names_give_module_paths() -> None:
    # Dynamo's L['self']._modules['layers']._modules['0']._modules['self_attn']... spelled out
    name = "l_self_modules_layers_modules_0_modules_self_attn_modules_qkv_proj_parameters_weight_"
    assert param_module(name) == "layers.0.self_attn.qkv_proj"
    assert (
        param_module(
            "L_self_modules_layers_modules_3_modules_self_attn_modules_rotary_emb_buffers_cos_sin_cache_"
        )
        == "layers.3.self_attn.rotary_emb"
    )
    assert param_module("L_self_modules_embed_tokens_parameters_weight_") == "embed_tokens"
    assert param_module("l_input_ids_") is None
    assert param_module("s72") is None


def test_every_submodule_of_the_split_graph_is_read() -> None:
    text = _text("computation_graph.py")
    assert len(_pieces()) == text.count("\n    class submod_")
    assert [p.name for p in _pieces()[:3]] == ["submod_0", "submod_1", "submod_2"]


def test_generated_modules_match_the_piece_they_were_compiled_from() -> None:
    # call 11's map says: the embedding is in j2 (the first piece), layer 31's MLP without a
    # next layer in 4m (the last piece), layer 0's MLP and layer 1's qkv in o5 (the first middle
    # piece; the middle pieces share one generated module)
    names = {key: match_piece(listed_names(_text(Path(key).name)), _pieces()) for key in _truth()}
    assert {k: p.name if p else None for k, p in names.items()} == {
        FIRST: "submod_0",
        MIDDLE: "submod_2",
        LAST: "submod_64",
    }


def test_nothing_is_matched_from_names_no_piece_holds() -> None:
    assert match_piece([], _pieces()) is None
    assert match_piece(["not_a_node", "nor_this", "linear"], _pieces()) is None


def test_frames_and_inputs_agree_with_the_recorded_map() -> None:
    for key, truth in _truth().items():
        nodes = _rebuilt(key).nodes
        assert set(nodes) == set(truth["nodes"]), key
        for name, want in truth["nodes"].items():
            got = nodes[name]
            frame = (got.file, got.line, got.function, got.code, got.inputs)
            assert frame == (
                want["file"],
                want["line"],
                want["function"],
                want["code"],
                want["inputs"],
            ), (key, name)


def test_module_paths_agree_with_the_recorded_map_where_a_parameter_names_them() -> None:
    same: Counter[str] = Counter()
    for key, truth in _truth().items():
        nodes = _rebuilt(key).nodes
        for name, want in truth["nodes"].items():
            got = nodes[name].module
            if got is None:
                continue
            if (key, name) == (MIDDLE, "index_select"):
                # every layer's rotary embedding shares one cos_sin_cache buffer: Dynamo names
                # it after layer 0, where the graph ran it in layer 1
                assert (got, want["module"]) == (
                    "layers.0.self_attn.rotary_emb",
                    "layers.1.self_attn.rotary_emb",
                )
                continue
            assert got == want["module"], (key, name)
            same[key] += 1
    # the nodes that read a parameter (directly or through _get_data_attr), from the graph text:
    # j2: embedding, rms_norm_default (input_layernorm), linear (qkv_proj), index_select;
    # 4m: linear (o_proj), fused_add_rms_norm_maybe_inplace, linear_1, linear_2;
    # o5: those four, fused_add_rms_norm_maybe_inplace_1 (layer 1's input_layernorm), linear_3
    assert same == {FIRST: 4, LAST: 4, MIDDLE: 6}


def _capture_owners(breakdown: Any) -> tuple[dict[str, int], dict[str, int]]:
    growth: Counter[str] = Counter()
    retained: Counter[str] = Counter()
    for t in breakdown.triggers:
        if t.phase == "capture":
            growth[t.owner] += t.bytes
    for r in breakdown.retained:
        if r.phase == "capture":
            retained[r.owner] += r.bytes
    return dict(growth), dict(retained)


def test_the_cache_hit_start_names_its_graph_pool_bytes_as_the_cold_start_does() -> None:
    snap = load_snapshot(HIT / "snapshot.rank0.json.gz")
    code = CompiledCode.model_validate(snap["compiled_code"])
    assert all(not f.nodes for f in code.files)  # as recorded: no map
    for f in code.files:
        attach_nodes(f, _piece_nodes(f))
    hit = _capture_owners(analyze(snap, rules=OwnerRules.default().with_compiled(code)))
    cold = _capture_owners(analyze(load_snapshot(COLD_RUN / "snapshot.rank0.json.gz")))
    for view in hit:
        named = sum(b for o, b in view.items() if not o.startswith(("compiled_piece", "unat")))
        assert named >= 0.95 * sum(view.values())
    assert hit == cold


def _piece_nodes(file: CompiledFile) -> dict[str, Any]:
    """The full node map of the piece ``file`` matched (attach_nodes keeps listed nodes only)."""
    piece = match_piece(listed_names(_text(Path(file.key).name)), _pieces())
    assert piece is not None
    return piece.nodes
