"""Owner rules: innermost matching frame wins, user rules first, unattributed keeps its frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.analysis import OwnerRules
from memest.errors import ConfigError


def frames(*specs: tuple[str, str]) -> list[list[object]]:
    return [[file, 10 + i, name] for i, (name, file) in enumerate(specs)]


INDEXER = "vllm/model_executor/layers/sparse_attn_indexer.py"


@pytest.mark.parametrize(
    ("stack", "owner"),
    [
        (
            frames(("as_fp32_logits", INDEXER), ("sparse_attn_indexer", INDEXER)),
            "indexer_logits_fp32",
        ),
        (
            frames(
                ("empty", "torch/_refs/__init__.py"),
                ("fp8_fp4_paged_mqa_logits", "vllm/utils/deep_gemm.py"),
                ("sparse_attn_indexer", INDEXER),
            ),
            "indexer_logits_bf16",
        ),
        (
            frames(("_maybe_add_hidden_state", "vllm/model_executor/models/interfaces.py")),
            "aux_hidden_states",
        ),
        (
            frames(
                ("compute_logits", "vllm/model_executor/models/qwen3_dspark.py"),
                ("compute_draft_logits", "vllm/model_executor/models/qwen3_dspark.py"),
                ("_sample_sequential", "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"),
            ),
            "draft_logits",
        ),
        (frames(("_alloc_attn_out", "vllm/models/deepseek_v4/attention.py")), "attn_output"),
        (
            frames(("_fused_qnorm_rope_kv_insert", "vllm/models/deepseek_v4/attention.py")),
            "qnorm_rope_kv_insert",
        ),
        (
            frames(
                ("_ensure_workspace_size", "vllm/v1/worker/workspace.py"),
                ("get_simultaneous", "vllm/v1/worker/workspace.py"),
                ("_allocate_buffers", "vllm/model_executor/layers/fused_moe/modular_kernel.py"),
            ),
            "moe_workspace",
        ),
        (frames(("allocate_kv_cache", "vllm/v1/worker/utils.py")), "kv_cache"),
        (
            frames(("load_weights", "vllm/model_executor/models/llama.py")),
            "weights",
        ),
    ],
)
def test_default_rules_vllm_0_33(stack: list[list[object]], owner: str) -> None:
    assert OwnerRules.default().classify(stack)[0] == owner


def test_unattributed_names_first_frame_outside_torch() -> None:
    stack = frames(
        ("empty", "torch/_refs/__init__.py"),
        ("wrapper", "memest_instrumentation/torch/recorder.py"),
        ("my_buffer", "mypkg/model.py"),
        ("forward", "mypkg/model.py"),
    )
    owner, top = OwnerRules.default().classify(stack)
    assert owner == "unattributed:my_buffer (mypkg/model.py)"
    assert top == "my_buffer (mypkg/model.py:12)"


def test_no_stack() -> None:
    assert OwnerRules.default().classify([])[0] == "unattributed:<no stack>"


def test_user_rules_win_at_the_same_frame(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": [{"owner": "mine", "function": "as_fp32_*"}]}))
    rules = OwnerRules.from_file(path)
    stack = frames(("as_fp32_logits", INDEXER))
    assert rules.classify(stack)[0] == "mine"
    # defaults still apply to everything else
    assert rules.classify(frames(("allocate_kv_cache", "vllm/v1/worker/utils.py")))[0] == "kv_cache"


def test_file_pattern_rule() -> None:
    rules = OwnerRules.from_data({"rules": [{"owner": "lib", "file": "*/mylib/*"}]})
    assert rules.classify(frames(("f", "/x/mylib/a.py")))[0] == "lib"
    assert rules.classify(frames(("f", "/x/other/a.py")))[0].startswith("unattributed:")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "rules"),
        ({"rules": [{"function": "x"}]}, "rules.rules[0].owner"),
        ({"rules": [{"owner": "a"}]}, "rules.rules[0]"),
        ({"rules": [{"owner": "a", "function": 3}]}, "rules.rules[0].function"),
        ({"rules": [{"owner": "a", "function": "f", "colour": "red"}]}, "rules.rules[0]"),
        ({"rules": [], "skip_files": "x"}, "rules.skip_files"),
    ],
)
def test_bad_rules_name_the_field(data: object, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        OwnerRules.from_data(data, source="rules")
    assert err.value.field == field


def test_rules_file_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        OwnerRules.from_file(path)


def test_to_data_round_trip() -> None:
    rules = OwnerRules.default()
    again = OwnerRules.from_data(rules.to_data())
    assert again.rules == rules.rules


def test_inductor_generated_frame_is_a_compiled_piece() -> None:
    # GIVEN a stack whose innermost non-torch frame is Inductor's generated `call` (as seen on the
    # H200 under VLLM_COMPILE, paths scrubbed), with only unowned vLLM frames above it
    rules = OwnerRules.default()
    stack = [
        ["torch/_ops.py", 10, "__call__"],
        ["oi/coib3vgu23kuxl5qdpiygkff23j2iuhckvu4ocfhk3gkjwbulfbp.py", 956, "call"],
        ["vllm/compilation/cuda_graph.py", 300, "__call__"],
    ]
    # WHEN classified THEN the owner is compiled_piece and the frame is kept for the reader
    owner, frame = rules.classify(stack)
    assert owner == "compiled_piece"
    assert frame == "call (oi/coib3vgu23kuxl5qdpiygkff23j2iuhckvu4ocfhk3gkjwbulfbp.py:956)"


def test_a_plain_call_function_stays_unattributed() -> None:
    rules = OwnerRules.default()
    owner, _ = rules.classify([["mypkg/model.py", 3, "call"]])
    assert owner == "unattributed:call (mypkg/model.py)"


# DSpark's draft-step stacks as the H200 start call30.P_qwen3_8b12l_dspark7_s64_t2048 recorded
# them (innermost first; torch's frames left out), vLLM 0.33.0's files and lines.
GEMM = ["vllm/model_executor/layers/utils.py", 89, "default_unquantized_gemm"]
PARAM = ["vllm/model_executor/parameter.py", 124, "__torch_function__"]
HEAD = [
    ["vllm/model_executor/layers/vocab_parallel_embedding.py", 83, "apply"],
    ["vllm/model_executor/layers/logits_processor.py", 144, "_apply_head"],
    ["vllm/model_executor/layers/logits_processor.py", 188, "_get_logits"],
    ["vllm/model_executor/layers/logits_processor.py", 109, "forward"],
]
DSPARK = "vllm/model_executor/models/qwen3_dspark.py"
SPEC = "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"
SAMPLE = [SPEC, 0, "_sample_sequential"]
OUTER = [[SPEC, 278, "_generate_draft"], ["vllm/v1/worker/gpu/cudagraph_utils.py", 502, "capture"]]


def _at(frame: list[object], line: int) -> list[object]:
    return [frame[0], line, frame[2]]


@pytest.mark.parametrize(
    ("stack", "owner"),
    [
        # compute_draft_logits: the lm_head over all K positions (rows x K x vocabulary)
        (
            [PARAM, GEMM, *HEAD, [DSPARK, 276, "compute_draft_logits"], _at(SAMPLE, 175), *OUTER],
            "draft_logits",
        ),
        # markov_bias -> DSparkMarkovHead.bias: markov_w2 through the same logits processor
        (
            [GEMM, *HEAD, [DSPARK, 93, "bias"], [DSPARK, 288, "markov_bias"], _at(SAMPLE, 190)],
            "draft_logits.markov_bias",
        ),
        ([[DSPARK, 285, "markov_embed"], _at(SAMPLE, 189), *OUTER], "draft_markov_embed"),
        # logits_i = base_logits[:, i] + bias: one draft step's logits
        ([_at(SAMPLE, 193), *OUTER], "draft_logits.step"),
        ([_at(SAMPLE, 173), *OUTER], "draft_sample_hidden"),
        ([_at(SAMPLE, 196), *OUTER], "draft_sampler"),
        (
            [
                ["vllm/model_executor/models/qwen3_dflash.py", 624, "_normalize_context_k"],
                [
                    "vllm/model_executor/models/qwen3_dflash.py",
                    665,
                    "precompute_and_store_context_kv",
                ],
            ],
            "draft_context_kv",
        ),
        # an eager linear layer nobody outside names (the drafter's fc, with the capture stream's
        # cuBLAS workspace): the deferred GEMM rule still names it
        (
            [
                PARAM,
                GEMM,
                ["vllm/model_executor/layers/linear.py", 242, "apply"],
                ["vllm/model_executor/models/qwen3_dflash.py", 846, "combine_hidden_states"],
                *OUTER,
            ],
            "gemm_workspace",
        ),
    ],
)
def test_dspark_draft_step_owners(stack: list[list[object]], owner: str) -> None:
    assert OwnerRules.default().classify(stack)[0] == owner


def test_a_deferred_rule_yields_to_a_named_outer_frame_only() -> None:
    rules = OwnerRules.from_data(
        {
            "rules": [
                {"owner": "helper", "function": "gemm_helper", "defer": True},
                {"owner": "head", "function": "head"},
            ]
        }
    )
    inner = ["a.py", 1, "gemm_helper"]
    assert rules.classify([inner, ["b.py", 2, "head"]]) == ("head", "head (b.py:2)")
    assert rules.classify([inner, ["b.py", 2, "other"]]) == ("helper", "gemm_helper (a.py:1)")
    # the first deferred owner is the fallback, an inner undeferred one still wins outright
    assert rules.classify([["c.py", 3, "head"], inner]) == ("head", "head (c.py:3)")
    assert {"owner": "helper", "function": "gemm_helper", "defer": True} in rules.to_data()["rules"]


@pytest.mark.parametrize(
    "rule",
    [
        {"owner": "a", "function": "f", "defer": "yes"},
        {"owner": "a", "module": "*.fc", "defer": True},
    ],
)
def test_bad_defer_names_the_rule(rule: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        OwnerRules.from_data({"rules": [rule]}, source="rules")
