"""memest's warm profile pass runs without vLLM 0.33.0's MLA stand-in for a context chunk.

vLLM's ``MLAAttention.forward_impl`` allocates, in a pass without attention metadata, a tensor of
``chunked_prefill_workspace_size`` rows, a property over ``_chunked_prefill_workspace_size``. The
plugin sets that width to 0 for its own pass and puts it back; the report then says so, and
memest.estimate.mla_context counts the whole chunk.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from memest.errors import ReportFormatError
from memest.estimate.phases import check_report
from memest.schema import RunConfig, RunReport
from tests.unit.instrumentation_vllm.conftest import vllm_or_skip


def _real_mla_layer(width: int) -> Any:
    vllm_or_skip()
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    layer = object.__new__(MLAAttention)  # its __init__ needs a model; the property does not
    layer._chunked_prefill_workspace_size = width
    return layer


def _vllm_config(layers: dict[str, Any]) -> Any:
    return types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(static_forward_context=layers)
    )


@pytest.mark.vllm
def test_the_stand_in_is_empty_during_the_pass_and_restored_after() -> None:
    import torch
    from memest_instrumentation.vllm.warm_pass import _without_mla_standin

    layer = _real_mla_layer(32768)
    other = types.SimpleNamespace(chunked_prefill_workspace_size=7)  # not an MLA layer
    config = _vllm_config({"layers.0.mla_attn": layer, "layers.0.attn": other})
    with _without_mla_standin(config) as changed:
        assert changed == 1
        assert layer.chunked_prefill_workspace_size == 0
        standin = torch.empty((layer.chunked_prefill_workspace_size, 16, 256))
        assert standin.numel() == 0
        assert other.chunked_prefill_workspace_size == 7
    assert layer.chunked_prefill_workspace_size == 32768


@pytest.mark.vllm
def test_the_width_comes_back_when_the_pass_fails() -> None:
    from memest_instrumentation.vllm.warm_pass import _without_mla_standin

    layer = _real_mla_layer(65536)
    with pytest.raises(RuntimeError), _without_mla_standin(_vllm_config({"a": layer})):
        raise RuntimeError("the profile pass failed")
    assert layer.chunked_prefill_workspace_size == 65536


@pytest.mark.vllm
def test_the_warm_pass_records_running_without_the_stand_in() -> None:
    from memest_instrumentation.vllm.state import state
    from memest_instrumentation.vllm.warm_pass import warm_profile_peak

    layer = _real_mla_layer(32768)
    seen: list[int] = []

    class Runner:
        def profile_run(self, randomize_inputs: bool = False) -> None:
            seen.append(layer.chunked_prefill_workspace_size)

    worker = types.SimpleNamespace(model_runner=Runner(), vllm_config=_vllm_config({"mla": layer}))
    st = state()
    st.config = RunConfig(model="dsv2", max_num_seqs=64)
    warm_profile_peak(worker)
    assert seen == [0]
    assert layer.chunked_prefill_workspace_size == 32768
    assert st.config.mla_warm_pass_without_standin is True
    assert any("without the MLA context stand-in of 1 layers" in n for n in st.notes)
    assert [p.name for p in st.phases] == ["profile_run.warm"]


def test_a_model_without_mla_records_nothing() -> None:
    from memest_instrumentation.vllm.state import state
    from memest_instrumentation.vllm.warm_pass import warm_profile_peak

    class Runner:
        def profile_run(self, randomize_inputs: bool = False) -> None:
            return None

    worker = types.SimpleNamespace(model_runner=Runner(), vllm_config=_vllm_config({}))
    st = state()
    st.config = RunConfig(model="llama", max_num_seqs=64)
    warm_profile_peak(worker)
    assert st.config.mla_warm_pass_without_standin is None


def test_a_report_claiming_a_stand_in_free_pass_needs_that_pass() -> None:
    """The flag says the headroom was read from memest's warm pass: without that phase the
    accounting would count the chunk twice, so the report is refused with the reason."""
    from pathlib import Path

    raw = Path(__file__).resolve().parents[3] / "tests/data/starts"
    path = raw / "call21.L_dsv2lite8l_s64_t2048_fa.apply.report.rank0.json"
    report = RunReport.model_validate_json(path.read_text())
    assert report.config.mla_warm_pass_without_standin is True
    check_report(report)
    stripped = report.model_copy(
        update={"phases": [p for p in report.phases if p.name != "profile_run.warm"]}
    )
    with pytest.raises(ReportFormatError, match="mla_warm_pass_without_standin"):
        check_report(stripped)


def test_the_warm_pass_skips_vllms_full_collection_and_restores_it() -> None:
    """vLLM's profile_run ends with gc.collect(); inside memest's pass it collects nothing, and
    the real gc.collect is back afterwards, also when the pass raises."""
    import gc

    from memest_instrumentation.vllm.state import state
    from memest_instrumentation.vllm.warm_pass import warm_profile_peak

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    collected: list[int] = []

    class Runner:
        def profile_run(self, randomize_inputs: bool = False) -> None:
            Cycle()
            collected.append(gc.collect())

    real = gc.collect
    worker = types.SimpleNamespace(model_runner=Runner(), vllm_config=_vllm_config({}))
    state().config = RunConfig(model="llama", max_num_seqs=64)
    warm_profile_peak(worker)
    assert collected == [0]
    assert gc.collect is real
    Cycle()
    assert gc.collect() >= 1  # the cycle left by the pass is collected by the real call

    class Failing:
        def profile_run(self, randomize_inputs: bool = False) -> None:
            raise RuntimeError("the pass failed")

    with pytest.raises(RuntimeError):
        warm_profile_peak(types.SimpleNamespace(model_runner=Failing(), vllm_config=None))
    assert gc.collect is real
