"""Owners through Inductor's generated code: parsing allocation sites and naming their owners.

The wrapper fixture follows torch 2.11's CUDA wrapper layout (allocations, "Topologically Sorted
Source Nodes" comments before kernel launches, ``get_raw_stream``, buffer reuse, kernel
definitions with their own comment); expected lines are found in the fixture's text here.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from memest.analysis import OwnerRules, analyze
from memest.analysis.inductor import (
    generated_key,
    innermost_frame,
    module_path,
    op_name,
    parse_generated,
    producer_order,
)
from memest.errors import ConfigError, SnapshotFormatError
from memest.schema import CompiledCode, CompiledFile, CompiledNode, CompiledSite
from memest.snapshot import load_snapshot

DATA = Path(__file__).resolve().parents[2] / "data"
ROOT = Path(__file__).resolve().parents[3]
FIXTURE = (DATA / "inductor" / "triton_wrapper.py.txt").read_text()
KEY = "ab/cabcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmn.py"
MiB = 1 << 20

NODES = {
    "rms_norm_in": CompiledNode(module="layers.0.input_layernorm"),
    "linear": CompiledNode(module="layers.0.self_attn.qkv_proj"),
    "q_normed": CompiledNode(module="layers.0.self_attn.q_norm"),
    "k_normed": CompiledNode(module="layers.0.self_attn.k_norm"),
    "rope_q": CompiledNode(module="layers.0.self_attn.rotary_emb"),
    "output": CompiledNode(module="layers.0.self_attn.attn"),
    "linear_2": CompiledNode(module="layers.0.mlp.gate_up_proj"),
    "add_5": CompiledNode(module="layers.0.mlp.mystery"),
}


def _line(text: str) -> int:
    """1-based line of the only line of the fixture containing ``text``."""
    hits = [i + 1 for i, line in enumerate(FIXTURE.splitlines()) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def _code(nodes: dict[str, CompiledNode] | None = None) -> CompiledCode:
    parsed = parse_generated(FIXTURE, KEY)
    parsed.nodes = dict(NODES if nodes is None else nodes)
    return CompiledCode(files=[parsed])


def _owner(rules: OwnerRules, line: int, path: str = f"/root/.cache/x/inductor_cache/{KEY}") -> str:
    frames = [
        ["torch/_ops.py", 10, "__call__"],
        [path, line, "call"],
        ["torch/_inductor/output_code.py", 656, "__call__"],
        ["vllm/compilation/piecewise_backend.py", 90, "__call__"],
    ]
    return rules.classify(frames)[0]


def test_generated_key_names_the_content_hash_path_scrubbed_or_not() -> None:
    assert generated_key(f"/tmp/torchinductor_u/{KEY}") == KEY
    assert generated_key(KEY) == KEY
    assert generated_key("vllm/model_executor/models/llama.py") is None


def test_dynamo_module_paths_and_stack_frames_are_normalised() -> None:
    assert module_path("L['self'].layers[3].self_attn.qkv_proj") == "layers.3.self_attn.qkv_proj"
    assert module_path("L['self'].embed_tokens") == "embed_tokens"
    trace = (
        '  File "/x/vllm/model_executor/models/llama.py", line 412, in forward\n'
        "    aux_hidden_states.append(hidden_states + residual)\n"
    )
    assert innermost_frame(trace) == (
        "/x/vllm/model_executor/models/llama.py",
        412,
        "forward",
        "aux_hidden_states.append(hidden_states + residual)",
    )
    assert innermost_frame("") is None


def test_sites_are_the_allocations_of_call_with_their_first_writer() -> None:
    # GIVEN the wrapper text WHEN parsed
    sites = {s.buffer: s for s in parse_generated(FIXTURE, KEY).sites}
    # THEN every empty_strided_cuda in call() and the allocating op call are sites; the
    # allocation inside a kernel's source string is not
    assert sorted(sites) == sorted(["buf0", "buf1", "buf2", "buf4", "buf5", "buf6", "buf7", "buf8"])
    assert sites["buf1"].line == _line("buf1 = empty_strided_cuda")
    assert sites["buf1"].kernel == "extern_kernels.mm"
    assert sites["buf1"].nodes == ["rms_norm_in", "linear"]
    # a launch without a comment of its own takes its kernel definition's comment
    assert sites["buf0"].kernel == "triton_red_fused_mean_mul_pow_rsqrt_0"
    assert sites["buf0"].nodes == ["rms_norm_in"]
    # a reused buffer (buf3 = buf2) is written by the launch that names its alias
    assert sites["buf2"].kernel == "triton_poi_fused_add_mul_1"
    assert sites["buf2"].nodes == ["q_normed", "k_normed", "rope_q"]
    assert sites["buf4"].kernel == "torch.ops.vllm.unified_attention_with_output.default"
    assert sites["buf5"].line == _line("buf5 = torch.ops.vllm")
    # a subscripted launch (kernel[grid](...)) without any comment: kernel known, no nodes
    assert sites["buf7"].kernel == "triton_poi_fused_mul_silu_2"
    assert sites["buf7"].nodes == []


@pytest.mark.parametrize(
    ("alloc", "owner"),
    [
        ("buf0 = empty", "norm"),
        ("buf1 = empty", "qkv_proj"),
        ("buf2 = empty", "qk_norm_rope"),
        ("buf4 = empty", "attn_output"),
        ("buf6 = empty", "mlp_gate_up"),
        ("buf7 = empty", "compiled_piece:no source node recorded"),
        ("buf8 = empty", "compiled_piece:no rule for layers.*.mlp.mystery"),
        ("del buf0", "compiled_piece:not an allocation site"),
    ],
)
def test_a_frame_in_mapped_generated_code_is_named_by_its_source_nodes(
    alloc: str, owner: str
) -> None:
    rules = OwnerRules.default().with_compiled(_code())
    assert _owner(rules, _line(alloc)) == owner


def test_without_a_map_compiled_code_stays_compiled_piece_and_says_why_with_one() -> None:
    assert _owner(OwnerRules.default(), _line("buf1 = empty")) == "compiled_piece"
    no_nodes = OwnerRules.default().with_compiled(_code(nodes={}))
    assert _owner(no_nodes, _line("buf1 = empty")) == "compiled_piece:no module map recorded"
    # another generated file than the mapped one
    other = f"zz/c{'z' * 52}.py"
    rules = OwnerRules.default().with_compiled(_code())
    assert _owner(rules, _line("buf1 = empty"), other) == "compiled_piece"


def test_an_eager_frame_inside_the_compiled_call_still_wins() -> None:
    rules = OwnerRules.default().with_compiled(_code())
    frames = [
        ["vllm/v1/worker/gpu/spec_decode/eagle.py", 50, "compute_draft_logits"],
        [KEY, _line("buf1 = empty"), "call"],
    ]
    assert rules.classify(frames)[0] == "draft_logits"


def test_code_rules_match_the_stack_frame_text_of_a_node() -> None:
    nodes = dict(NODES)
    nodes["linear"] = CompiledNode(
        module="",
        file="vllm/model_executor/models/llama.py",
        line=412,
        function="forward",
        code="aux_hidden_states.append(hidden_states + residual)",
    )
    rules = OwnerRules.default().with_compiled(_code(nodes))
    assert _owner(rules, _line("buf1 = empty")) == "aux_hidden_states"


def test_user_rules_name_modules_and_bad_keys_are_named() -> None:
    user = OwnerRules.from_data({"rules": [{"owner": "my_mlp", "module": "*.mlp.mystery"}]})
    rules = OwnerRules.default().extend(user).with_compiled(_code())
    assert _owner(rules, _line("buf8 = empty")) == "my_mlp"
    assert rules.to_data()["rules"][0] == {"owner": "my_mlp", "module": "*.mlp.mystery"}
    with pytest.raises(ConfigError, match="unknown keys"):
        OwnerRules.from_data({"rules": [{"owner": "x", "modul": "*"}]})
    with pytest.raises(ConfigError, match="a rule needs"):
        OwnerRules.from_data({"rules": [{"owner": "x"}]})


def _snapshot(lines: list[int]) -> dict[str, object]:
    """A capture-stage history: one 2 MiB segment and allocation per generated line."""
    frames = [[KEY, ln, "call"] for ln in lines]
    n = len(lines)
    actions, addr, size, stack = [], [], [], []
    for i in range(n):
        base = (i + 1) << 24
        actions += [0, 1]
        addr += [base, base]
        size += [2 * MiB, MiB]
        stack += [i, i]
    return {
        "format": "memest.allocator_snapshot",
        "version": 1,
        "source": {},
        "frames": frames,
        "stacks": [[i] for i in range(n)],
        "tags": ["", "memest/1;phase=capture;stage=target.piecewise;pool=0,1"],
        "actions": ["segment_alloc", "alloc"],
        "events": {
            "action": actions,
            "addr": addr,
            "size": size,
            "stream": [0] * 2 * n,
            "time_us": list(range(2 * n)),
            "tag": [1] * 2 * n,
            "stack": stack,
        },
        "segments": [],
        "windows": [],
        "phases": [],
    }


def test_analysis_charges_pool_growth_and_retained_bytes_to_named_owners() -> None:
    lines = [_line("buf1 = empty"), _line("buf6 = empty"), _line("buf7 = empty")]
    snap = _snapshot(lines)
    snap["compiled_code"] = _code().model_dump(mode="json")
    breakdown = analyze(snap)
    triggers = {t.owner: t.bytes for t in breakdown.triggers}
    assert triggers == {
        "qkv_proj": 2 * MiB,
        "mlp_gate_up": 2 * MiB,
        "compiled_piece:no source node recorded": 2 * MiB,
    }
    retained = {r.owner: r.bytes for r in breakdown.retained}
    assert retained == {
        "qkv_proj": MiB,
        "mlp_gate_up": MiB,
        "compiled_piece:no source node recorded": MiB,
    }
    assert not breakdown.unattributed


def test_a_malformed_map_in_a_snapshot_is_named() -> None:
    snap = _snapshot([_line("buf1 = empty")])
    snap["compiled_code"] = {"files": [{"key": 3}]}
    with pytest.raises(SnapshotFormatError, match="compiled_code.files.0"):
        analyze(snap)


@pytest.mark.parametrize(
    "path",
    # calls 3-5 ran before the plugin recorded a map of the generated code
    sorted((ROOT / "tests" / "data" / "starts").glob("call[3-5].*.snapshot.rank0.json.gz"))[:2],
    ids=lambda p: p.name,
)
def test_real_h200_histories_analyze_the_same_with_an_unrelated_map(path: Path) -> None:
    # GIVEN a real vLLM start's history (no map of its generated code was recorded)
    snap = load_snapshot(path)
    plain = analyze(snap)
    # WHEN a map of other generated code is attached THEN nothing changes
    mapped = analyze(snap, rules=OwnerRules.default().with_compiled(_code()))
    assert mapped.model_dump() == plain.model_dump()
    assert any(t.owner == "compiled_piece" for t in plain.triggers)


def test_a_real_snapshot_file_is_gzip_json_with_generated_frames() -> None:
    path = sorted((ROOT / "tests" / "data" / "starts").glob("*.snapshot.rank0.json.gz"))[0]
    frames = json.loads(gzip.decompress(path.read_bytes()))["frames"]
    keys = {generated_key(str(f[0])) for f in frames} - {None}
    assert keys, "the H200 histories' frames name Inductor's generated files"


# An extern op's comment lists the nodes it reads as well: torch 2.14's CPU wrapper for the
# small model of tests/unit/instrumentation_vllm/inductor_block.py lists SDPA's node ``o`` in the
# middle of the q/k-norm and RoPE nodes that feed it (the order Inductor scheduled their ATen
# nodes in). The names and edges below are that graph's (module paths as Dynamo records them).
_SDPA_LISTED = [
    "split", "view", "q_1", "q_2", "transpose", "o", "view_1", "k_1", "k_2", "transpose_1",
    "view_2", "transpose_2",
]  # fmt: skip
_SDPA_NODES = {
    "split": CompiledNode(module="layers.0.self_attn", inputs=[]),
    "view": CompiledNode(module="layers.0.self_attn", inputs=["split"]),
    "q_1": CompiledNode(module="layers.0.self_attn.q_norm", inputs=["view"]),
    "q_2": CompiledNode(module="layers.0.self_attn", inputs=["q_1"]),
    "transpose": CompiledNode(module="layers.0.self_attn", inputs=["q_2"]),
    "o": CompiledNode(
        module="layers.0.self_attn",
        code="o = F.scaled_dot_product_attention(",
        target="torch._C._nn.scaled_dot_product_attention",
        inputs=["transpose", "transpose_1", "transpose_2"],
    ),
    "view_1": CompiledNode(module="layers.0.self_attn", inputs=["split"]),
    "k_1": CompiledNode(module="layers.0.self_attn.k_norm", inputs=["view_1"]),
    "k_2": CompiledNode(module="layers.0.self_attn", inputs=["k_1"]),
    "transpose_1": CompiledNode(module="layers.0.self_attn", inputs=["k_2"]),
    "view_2": CompiledNode(module="layers.0.self_attn", inputs=["split"]),
    "transpose_2": CompiledNode(module="layers.0.self_attn", inputs=["view_2"]),
}
_SDPA_KERNEL = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"


def _one_site(kernel: str, listed: list[str], nodes: dict[str, CompiledNode]) -> CompiledCode:
    site = CompiledSite(line=3, buffer="buf7", kernel=kernel, nodes=listed)
    return CompiledCode(files=[CompiledFile(key=KEY, sites=[site], nodes=nodes)])


def test_an_extern_op_is_charged_to_the_node_that_produces_it_not_to_its_inputs() -> None:
    code = _one_site(_SDPA_KERNEL, _SDPA_LISTED, _SDPA_NODES)
    # the producer is the listed node no other listed node reads: o
    assert producer_order(code.files[0], code.files[0].sites[0]) == ["o"]
    assert _owner(OwnerRules.default().with_compiled(code), 3) == "attn_output"
    # with module rules only, the site says which module lacks a rule, never q/k-norm
    module_only = OwnerRules(rules=[r for r in OwnerRules.default().rules if r.module])
    assert (
        _owner(module_only.with_compiled(code), 3)
        == "compiled_piece:no rule for layers.*.self_attn"
    )


def test_an_extern_op_matching_a_node_op_names_that_node() -> None:
    # GIVEN vLLM's attention op listed first, its q/k-norm inputs after it, no edges recorded
    nodes = {
        "output": CompiledNode(
            module="layers.0.self_attn.attn",
            target="torch.ops.vllm.unified_attention_with_output.default",
        ),
        "q_normed": CompiledNode(module="layers.0.self_attn.q_norm"),
        "k_normed": CompiledNode(module="layers.0.self_attn.k_norm"),
    }
    code = _one_site(
        "torch.ops.vllm.unified_attention_with_output.default",
        ["output", "q_normed", "k_normed"],
        nodes,
    )
    assert op_name("torch.ops.vllm.unified_attention_with_output.default") == (
        "vllm.unified_attention_with_output"
    )
    assert op_name("extern_kernels.mm") is None
    assert _owner(OwnerRules.default().with_compiled(code), 3) == "attn_output"


def test_a_generated_kernel_still_falls_back_to_the_nodes_it_fuses() -> None:
    # a Triton kernel computes every listed node: an unnamed sink lets an upstream node name it
    nodes = {
        "rms": CompiledNode(module="layers.0.input_layernorm", inputs=[]),
        "mystery": CompiledNode(module="layers.0.mystery", inputs=["rms"]),
    }
    code = _one_site("triton_poi_fused_0", ["rms", "mystery"], nodes)
    assert producer_order(code.files[0], code.files[0].sites[0]) == ["mystery", "rms"]
    assert _owner(OwnerRules.default().with_compiled(code), 3) == "norm"
    # a map without edges (recorded before inputs were) keeps the last-listed-first order
    bare = {k: CompiledNode(module=v.module) for k, v in _SDPA_NODES.items()}
    code = _one_site(_SDPA_KERNEL, _SDPA_LISTED, bare)
    assert producer_order(code.files[0], code.files[0].sites[0])[0] == "transpose_2"


def test_unsorted_comments_and_strided_allocations_are_read() -> None:
    # GIVEN the wrapper forms torch 2.11 and 2.14 share besides the fixture's: an "Unsorted"
    # source-node comment (nodes from several graphs) and an allocation with an as_strided view
    source = (
        "def call(args):\n"
        "    buf0 = empty_strided_cuda((8, 64), (64, 1), torch.bfloat16).as_strided((8, 32), (64, 1))\n"
        "    # Unsorted Source Nodes: [linear_9], Original ATen: [aten.mm]\n"
        "    extern_kernels.mm(args[0], args[1], out=buf0)\n"
        "    buf1 = empty_strided_p2p((8, ), (1, ), torch.bfloat16, torch.device('cuda:0'), group_name='0', alloc_id=1)\n"
        "    return (buf0, buf1, )\n"
    )
    sites = parse_generated(source, KEY).sites
    assert [(s.line, s.buffer, s.kernel, s.nodes) for s in sites] == [
        (2, "buf0", "extern_kernels.mm", ["linear_9"]),
        (5, "buf1", None, []),
    ]


# --------------------------------------------------------------------------- site structure
def test_parse_keeps_the_lines_of_extern_op_calls() -> None:
    parsed = parse_generated(FIXTURE, KEY)
    calls = {c.line: c.kernel for c in parsed.calls}
    assert calls[_line("out=buf1)")] == "extern_kernels.mm"
    assert all(line not in calls for line in (s.line for s in parsed.sites))


@pytest.mark.parametrize("recorded_calls", [True, False])
def test_an_allocation_inside_an_extern_gemm_call_is_the_cublas_workspace(
    recorded_calls: bool,
) -> None:
    code = _code()
    if not recorded_calls:  # a map recorded before call lines were kept: inferred from the site
        code.files[0].calls = []
    rules = OwnerRules.default().with_compiled(code)
    assert _owner(rules, _line("out=buf1)")) == "cublas_workspace"
    assert _owner(rules, _line("del buf0")) == "compiled_piece:not an allocation site"


def _file(source: str, nodes: dict[str, CompiledNode]) -> CompiledCode:
    parsed = parse_generated(source, KEY)
    parsed.nodes = nodes
    return CompiledCode(files=[parsed])


PIECE = """
def call(args):
    arg0_1, arg1_1, s0 = args
    buf0 = empty_strided_cuda((s0, 8192), (8192, 1), torch.bfloat16)
    triton_red_fused_0.run(arg0_1, buf0, s0, 4096, stream=stream0)
    buf1 = empty_strided_cuda((s0, 6144), (6144, 1), torch.bfloat16)
    # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.mm]
    extern_kernels.mm(buf0, reinterpret_tensor(arg1_1, (8192, 6144), (1, 8192), 0), out=buf1)
    del buf0
    buf2 = empty_strided_cuda((s0, 4096), (4096, 1), torch.bfloat16)
    return (buf2, buf1, )
"""


def test_unwritten_output_and_an_uncommented_gemm_input_are_named_by_structure() -> None:
    lines = PIECE.splitlines()
    code = _file(PIECE, {"linear": CompiledNode(module="layers.0.self_attn.qkv_proj")})
    rules = OwnerRules.default().with_compiled(code)
    # the buffer the piece hands, unwritten, to the attention op that follows it
    assert (
        _owner(
            rules,
            lines.index("    buf2 = empty_strided_cuda((s0, 4096), (4096, 1), torch.bfloat16)") + 1,
        )
        == "attn_output"
    )
    # written by a kernel whose comment lists nothing, read by the qkv_proj GEMM right after
    assert (
        _owner(
            rules,
            lines.index("    buf0 = empty_strided_cuda((s0, 8192), (8192, 1), torch.bfloat16)") + 1,
        )
        == "qkv_input"
    )
    # the GEMM's own output keeps its source node's owner
    assert (
        _owner(
            rules,
            lines.index("    buf1 = empty_strided_cuda((s0, 6144), (6144, 1), torch.bfloat16)") + 1,
        )
        == "qkv_proj"
    )


def test_a_site_rule_and_a_line_rule_load_from_data() -> None:
    rules = OwnerRules.from_data(
        {
            "rules": [
                {"owner": "mine", "site": "unwritten"},
                {"owner": "f", "function": "g", "line": 7},
            ]
        }
    )
    assert rules.rules[0].site == "unwritten" and rules.rules[0].compiled_only
    assert rules.classify([["a.py", 7, "g"]])[0] == "f"
    assert rules.classify([["a.py", 8, "g"]])[0].startswith("unattributed:")
    assert OwnerRules.from_data(rules.to_data()).rules == rules.rules
    with pytest.raises(ConfigError, match="line number"):
        OwnerRules.from_data({"rules": [{"owner": "f", "function": "g", "line": "7"}]})
