"""The plugin records the model's and the drafter's dimensions from vLLM 0.33.0's own config
classes (ModelConfig, SpeculativeConfig with an EAGLE3 drafter, built on CPU from config.json
folders), and a what-if on the report then needs no --model-config."""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from pathlib import Path
from typing import Any

import pytest

from memest.estimate import what_if
from memest.estimate.runner_buffers import ModelDims
from memest.schema import RunConfig, RunReport
from tests.unit.instrumentation_vllm.conftest import vllm_or_skip

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
REPORT = ROOT / "tests/data/starts/call9.S_llama8b_s128_t4096.apply.report.rank0.json"


def _folder(tmp: Path, name: str, example: str) -> str:
    folder = tmp / name
    folder.mkdir()
    shutil.copy(EXAMPLES / example, folder / "config.json")
    return str(folder)


def _vllm_config(tmp: Path) -> Any:
    vllm_or_skip()
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target = ModelConfig(
        model=_folder(tmp, "llama8b", "llama8b.config.json"),
        skip_tokenizer_init=True,
        max_model_len=4096,
    )
    spec = SpeculativeConfig(
        method="eagle3",
        model=_folder(tmp, "eagle3", "eagle3_8b.config.json"),
        num_speculative_tokens=3,
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
    )
    return types.SimpleNamespace(model_config=target, speculative_config=spec)


@pytest.mark.vllm
def test_dims_from_vllms_config_classes(tmp_path: Path) -> None:
    from memest_instrumentation.vllm import dims
    from memest_instrumentation.vllm.state import state

    vc = _vllm_config(tmp_path)
    st = state()
    st.config = RunConfig(model="llama8b", speculative_method="eagle3", num_speculative_tokens=3)
    dims.record(vc)
    model, drafter = st.config.model_dims, st.config.drafter_dims
    assert model is not None and drafter is not None
    target_json = json.loads((EXAMPLES / "llama8b.config.json").read_text())
    drafter_json = json.loads((EXAMPLES / "eagle3_8b.config.json").read_text())
    for key in ("hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers"):
        assert getattr(model, key) == target_json[key], key
        assert getattr(drafter, key) == drafter_json[key], key
    assert model.dtype == drafter.dtype == "bfloat16"
    assert model.num_key_value_heads == 8 and model.architectures == ["LlamaForCausalLM"]

    # A report with the recorded dims gives the what-if what the config.json files give.
    report = RunReport.model_validate_json(REPORT.read_text())
    recorded = report.model_copy(
        update={
            "config": report.config.model_copy(
                update={"model_dims": model, "drafter_dims": drafter}
            )
        }
    )
    from_files = ModelDims.from_report(report, target_json, drafter=drafter_json)
    from_report = ModelDims.from_report(recorded)
    assert from_report == from_files
    assert from_report is not None and from_files is not None
    assert from_report.drafter_weight_bytes("eagle3") == from_files.drafter_weight_bytes("eagle3")
    grid = {
        "max_num_seqs": 32,
        "speculative_config": {"method": "eagle3", "num_speculative_tokens": 3},
    }
    a = what_if(recorded, grid)
    b = what_if(report, grid, dims=from_files)
    assert a.terms_to == b.terms_to
    assert not any("--model-config" in n for n in a.notes)


def test_a_config_that_cannot_be_read_is_a_hook_error_not_a_lost_config() -> None:
    from memest_instrumentation.vllm import dims
    from memest_instrumentation.vllm.state import guarded, state

    class Broken:
        @property
        def hf_text_config(self) -> Any:
            raise RuntimeError("no config here")

    st = state()
    st.config = RunConfig(model="m", max_num_seqs=8)
    guarded("model_dims", dims.record, types.SimpleNamespace(model_config=Broken()))
    assert st.config is not None and st.config.max_num_seqs == 8
    assert st.config.model_dims is None
    assert any("model_dims" in e for e in st.hook_errors)


def test_missing_dimensions_record_nothing() -> None:
    from memest_instrumentation.vllm import dims

    no_vocab = types.SimpleNamespace(hf_text_config=types.SimpleNamespace(hidden_size=64))
    assert dims.model_shape(no_vocab) is None
    assert dims.model_shape(None) is None
    half = types.SimpleNamespace(
        dtype="torch.float16",
        hf_text_config=types.SimpleNamespace(hidden_size=64, vocab_size=100, head_dim=True),
    )
    shape = dims.model_shape(half)
    assert shape is not None and shape.dtype == "float16" and shape.head_dim is None


MOE_REPORT = (
    ROOT
    / "tests/data/starts/call14.M_qwen3moe8l_s64_t2048.apply-hist-cold-stephist.report.rank0.json"
)


@pytest.mark.vllm
def test_moe_dims_recorded_from_vllms_model_config_move_the_moe_workspace(tmp_path: Path) -> None:
    """A Qwen3-MoE report whose dims the plugin recorded from vLLM's ModelConfig gives the same
    what-if as the model's config.json given by hand: the fused-MoE workspace, sized by
    max_num_batched_tokens, moves with the grid."""
    vllm_or_skip()
    from memest_instrumentation.vllm import dims
    from vllm.config import ModelConfig

    folder = tmp_path / "qwen3moe"
    folder.mkdir()
    shutil.copy(ROOT / "lab/models/qwen3moe_8l/config.json", folder / "config.json")
    target = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=4096)
    recorded = dims.model_shape(target)
    assert recorded is not None
    assert (recorded.num_experts, recorded.num_experts_per_tok) == (128, 8)

    report = RunReport.model_validate_json(MOE_REPORT.read_text())
    report = report.model_copy(
        update={"config": report.config.model_copy(update={"model_dims": recorded})}
    )
    config = json.loads((folder / "config.json").read_text())
    grid = {"max_num_batched_tokens": 4096}
    from_report = what_if(report, grid, dims=ModelDims.from_report(report))
    from_config = what_if(report, grid, dims=ModelDims.from_report(report, config))
    assert from_report.terms_to is not None and from_report.terms_from is not None
    moved = (
        from_report.terms_to.profiling_residue_bytes
        - from_report.terms_from.profiling_residue_bytes
    )
    assert moved > 0
    assert from_report.kv_budget_bytes_to == from_config.kv_budget_bytes_to


def _mla_config(tmp: Path) -> RunConfig:
    shutil.copy(ROOT / "lab/models/dsv2lite_8l/config.json", tmp / "config.json")
    cfg = json.loads((tmp / "config.json").read_text())
    from memest.schema import ModelShape

    dims = ModelShape.model_validate({k: v for k, v in cfg.items() if k in ModelShape.model_fields})
    return RunConfig(model="dsv2", max_model_len=4096, max_num_seqs=64, model_dims=dims)


@pytest.mark.vllm
def test_the_mla_prefill_backend_is_recorded(tmp_path: Path) -> None:
    """A FlashAttention prefill backend says whether it pads v (FA2 does; its class does not
    import without CUDA, so a stand-in carries its two attributes); vLLM 0.33.0's own CPU SDPA
    backend class has no such attribute and pads nothing. The term follows the record."""
    vllm_or_skip()
    from memest_instrumentation.vllm import dims
    from memest_instrumentation.vllm.state import state
    from vllm.v1.attention.backends.mla.prefill.cpu_sdpa import CPUSDPAMLAPrefillBackend

    from memest.estimate.mla_context import run_mla_context_bytes

    flash = types.SimpleNamespace(get_name=lambda: "FLASH_ATTN", requires_v_padding=True)
    cpu = object.__new__(CPUSDPAMLAPrefillBackend)  # its __init__ needs a model; get_name not
    st = state()
    terms = {}
    for backend, name, padded in ((flash, "FLASH_ATTN", True), (cpu, "CPU_SDPA_MLA", False)):
        decode = types.SimpleNamespace(get_name=lambda: "TRITON_MLA")
        layers = {
            "model.layers.0.mlp": types.SimpleNamespace(),
            "model.layers.0.self_attn.mla_attn": types.SimpleNamespace(
                prefill_backend=backend, attn_backend=decode
            ),
        }
        vc = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=layers)
        )
        st.config = _mla_config(tmp_path)
        dims.record_mla_prefill(vc)
        assert st.config.mla_prefill_backend == name
        assert st.config.mla_prefill_v_padded is padded
        assert st.config.mla_decode_backend == "TRITON_MLA"
        terms[padded] = run_mla_context_bytes(st.config, 16)
    assert terms[True] > terms[False] > 0


def test_no_mla_prefill_record_without_mla() -> None:
    from memest_instrumentation.vllm import dims
    from memest_instrumentation.vllm.state import state

    st = state()
    st.config = RunConfig(model="m", max_num_seqs=8)
    backend = types.SimpleNamespace(requires_v_padding=True)
    layers = {"a": types.SimpleNamespace(prefill_backend=backend)}
    dims.record_mla_prefill(
        types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=layers)
        )
    )
    assert st.config.mla_prefill_backend is None and st.config.mla_prefill_v_padded is None


def test_kv_cache_dtype_and_quantization_are_recorded() -> None:
    from memest_instrumentation.vllm import collect
    from memest_instrumentation.vllm.state import state

    cc = types.SimpleNamespace(
        cudagraph_capture_sizes=[1, 2],
        max_cudagraph_capture_size=2,
        cudagraph_mode="FULL_AND_PIECEWISE",
        mode="VLLM_COMPILE",
    )
    vc = types.SimpleNamespace(
        compilation_config=cc,
        scheduler_config=types.SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=64),
        speculative_config=None,
        model_config=types.SimpleNamespace(
            served_model_name="m", model="m", max_model_len=64, quantization="fp8"
        ),
        cache_config=types.SimpleNamespace(gpu_memory_utilization=0.8, cache_dtype="fp8_e4m3"),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
    )
    collect.read_config(types.SimpleNamespace(vllm_config=vc))
    config = state().config
    assert config is not None
    assert config.kv_cache_dtype == "fp8_e4m3" and config.quantization == "fp8"


def test_a_dsa_models_top_k_is_recorded() -> None:
    from memest_instrumentation.vllm import dims

    config = json.loads((ROOT / "lab/models/dsv32_4l/config.json").read_text())
    model_config = types.SimpleNamespace(
        hf_text_config=types.SimpleNamespace(**config), dtype="torch.bfloat16"
    )
    shape = dims.model_shape(model_config)
    assert shape is not None
    assert (shape.index_topk, shape.kv_lora_rank, shape.dtype) == (2048, 512, "bfloat16")


def test_utilization_is_the_fields_where_vllm_has_no_resolved_one() -> None:
    from memest_instrumentation.vllm.collect import resolved_utilization

    assert resolved_utilization(types.SimpleNamespace(gpu_memory_utilization=0.8)) == 0.8
    unset = types.SimpleNamespace(gpu_memory_utilization=None, resolved_gpu_memory_utilization=1.0)
    assert resolved_utilization(unset) == 1.0


@pytest.mark.vllm
def test_a_gated_delta_net_model_records_what_its_prefill_term_reads(tmp_path: Path) -> None:
    """vLLM's ModelConfig of the Qwen3-Next-class config.json: the recorded dims carry the
    linear-attention fields, the GDN layer's prefill backend is recorded from the forward
    context, and the report's full-batch step reserve is the one config.json gives."""
    vllm_or_skip()
    from memest_instrumentation.vllm import dims
    from memest_instrumentation.vllm.state import state
    from vllm.config import ModelConfig

    from memest.estimate.activation import activation_shape
    from memest.estimate.model_shape import model_shape
    from memest.estimate.sampler import run_serving_step_bytes, serving_step_reserve_bytes

    folder = tmp_path / "qwen3next"
    folder.mkdir()
    shutil.copy(ROOT / "tests/data/configs/qwen3next_8l.json", folder / "config.json")
    target = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=4096)
    recorded = dims.model_shape(target)
    assert recorded is not None
    assert (recorded.linear_num_value_heads, recorded.linear_key_head_dim) == (32, 128)
    st = state()
    st.config = RunConfig(
        model="qwen3next", max_num_seqs=64, max_num_batched_tokens=2048, model_dims=recorded
    )
    layers = {
        "model.layers.3.self_attn.attn": types.SimpleNamespace(),
        "model.layers.0.linear_attn": types.SimpleNamespace(gdn_prefill_backend="triton"),
    }
    dims.record_gdn_prefill(
        types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=layers)
        )
    )
    assert st.config.gdn_prefill_backend == "triton"
    config = json.loads((folder / "config.json").read_text())
    by_hand = serving_step_reserve_bytes(activation_shape(model_shape(config)), 64, 2048, "triton")
    assert run_serving_step_bytes(st.config) == by_hand
    without = dataclasses.replace(activation_shape(model_shape(config)), gdn=None)
    assert by_hand > serving_step_reserve_bytes(without, 64, 2048)  # the prefill's states
