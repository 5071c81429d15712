"""memest's warm profile pass leaves out a DFlash / DSpark drafter's block routine when serving
only ever replays it from its FULL graphs.

vLLM 0.33.0's ``DFlashSpeculator.propose`` dispatches every batch (each request has exactly
``num_query_per_req`` query tokens) to its FULL graphs and drafts eagerly only in the profile
run, so the draft logits the profile run allocates are already in the graph-pool term. The
candidates here are built by vLLM's own ``CudaGraphManager._init_candidates`` for the lab's DSpark
start (call 30: 64 sequences, K = 7, the 51 capture sizes of test_dspark_plan.py).
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from tests.unit.instrumentation_vllm.conftest import vllm_or_skip
from tests.unit.lab.test_dspark_plan import CAPTURE_SIZES, DRAFT_BLOCK_REQUESTS

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_release("0.33.0")]


def _manager(
    *, mode: str = "FULL_DECODE_ONLY", max_size: int = 512, loras: tuple[int, ...] = (0,)
) -> Any:
    vllm_or_skip()
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    manager = object.__new__(CudaGraphManager)  # its __init__ needs a device and a PP group
    sizes = [s for s in CAPTURE_SIZES if s <= max_size]
    manager.compilation_config = types.SimpleNamespace(
        cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max_size
    )
    manager.cudagraph_mode = CUDAGraphMode[mode]
    manager.max_num_reqs = 64
    manager.decode_query_len = 7  # DSpark with sample_from_anchor: K query slots
    manager.vllm_config = types.SimpleNamespace(
        speculative_config=None,
        cache_config=types.SimpleNamespace(use_kda_recoverssm=False),
    )
    manager.varlen_decode = False
    manager.lora_capture_cases = list(loras)
    manager.ubatch_runner = None
    manager._candidates = {}
    manager._capture_descs = {}
    manager._init_candidates()
    return manager


class _Speculator:
    def __init__(self, manager: Any) -> None:
        self.query_cudagraph_manager = manager
        self.num_query_per_req = 7
        self.drafted = 0

    def _generate_draft(self, *args: Any, **kwargs: Any) -> None:
        self.drafted += 1


def test_vllms_candidates_are_the_plans_45_graphs_and_cover_every_batch() -> None:
    from memest_instrumentation.vllm.warm_pass import draft_block_graphed_up_to

    manager = _manager()
    full = {d.num_reqs for descs in manager._candidates.values() for d in descs}
    assert sorted(full) == DRAFT_BLOCK_REQUESTS
    assert draft_block_graphed_up_to(_Speculator(manager)) == 64


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"max_size": 256}, "batches above 36 requests (252 tokens) have no graph"),
        # DFlashSpeculator.init_cudagraph_manager turns a mode without FULL decode into NONE
        ({"mode": "NONE"}, "no graphs: the block runs eagerly"),
        ({"mode": "PIECEWISE"}, "no FULL decode graphs: the block runs eagerly"),
        ({"loras": (0, 1)}, "LoRA cases are not modelled"),
    ],
)
def test_a_batch_that_would_run_eagerly_keeps_the_block_in_the_pass(
    kwargs: dict[str, Any], why: str
) -> None:
    from memest_instrumentation.vllm.warm_pass import draft_block_graphed_up_to

    assert draft_block_graphed_up_to(_Speculator(_manager(**kwargs))) == 0, why


def test_the_block_is_skipped_during_the_pass_only() -> None:
    from memest_instrumentation.vllm.warm_pass import _without_graphed_draft_block

    spec = _Speculator(_manager())
    runner = types.SimpleNamespace(speculator=spec)
    with _without_graphed_draft_block(runner) as covered:
        assert covered == 64
        spec._generate_draft(64, 448, None, None, None)
        assert spec.drafted == 0
    spec._generate_draft(64, 448, None, None, None)
    assert spec.drafted == 1
    assert "_generate_draft" not in vars(spec)
    with pytest.raises(RuntimeError), _without_graphed_draft_block(runner):
        raise RuntimeError("the profile pass failed")
    assert "_generate_draft" not in vars(spec)


def test_without_a_query_graph_manager_nothing_changes() -> None:
    from memest_instrumentation.vllm.warm_pass import _without_graphed_draft_block

    eagle_like = types.SimpleNamespace(_generate_draft=lambda: "drafted")
    for runner in (types.SimpleNamespace(speculator=None), types.SimpleNamespace()):
        with _without_graphed_draft_block(runner) as covered:
            assert covered == 0
    with _without_graphed_draft_block(types.SimpleNamespace(speculator=eagle_like)) as covered:
        assert covered == 0
        assert eagle_like._generate_draft() == "drafted"


class _Layer:
    """A draft attention layer as the warm pass sees it: vLLM's real backend class."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def get_attn_backend(self) -> Any:
        return self.backend

    def get_kv_cache_spec(self, vllm_config: Any) -> None:
        return None


def _dspark_before_kv_init(monkeypatch: pytest.MonkeyPatch, backend: Any, mode: str) -> Any:
    """A DSpark speculator as it stands when the warm pass runs: loaded, with no query graph
    manager yet (vLLM builds it in initialize_kv_cache)."""
    vllm_or_skip()
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    # The manager's __init__ reads the PP group and the platform's graph pool handle.
    monkeypatch.setattr(
        cudagraph_utils,
        "get_pp_group",
        lambda: types.SimpleNamespace(is_first_rank=True, is_last_rank=True),
    )
    monkeypatch.setattr(
        cudagraph_utils.current_platform, "get_global_graph_pool", lambda: None, raising=False
    )
    spec = object.__new__(DFlashSpeculator)
    spec.vllm_config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(
            cudagraph_mode=CUDAGraphMode[mode],
            cudagraph_capture_sizes=list(CAPTURE_SIZES),
            max_cudagraph_capture_size=512,
            static_forward_context={"drafter.layers.0.attn": _Layer(backend)},
        ),
        scheduler_config=types.SimpleNamespace(max_num_seqs=64),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, data_parallel_size=1),
        speculative_config=None,
        cache_config=types.SimpleNamespace(use_kda_recoverssm=False),
        attention_config=None,
    )
    spec.device = "cpu"
    spec.num_query_per_req = 7
    spec.draft_attn_layer_names = {"drafter.layers.0.attn"}
    spec.query_cudagraph_manager = None
    monkeypatch.setattr(DFlashSpeculator, "attn_vllm_config", property(lambda s: s.vllm_config))
    return spec


def test_before_kv_init_the_manager_vllm_will_build_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Call 33: the real DSpark start ran its warm pass with no query graph manager yet, so the
    block stayed in the pass (467,664,896 B, as in call 30)."""
    vllm_or_skip()
    from memest_instrumentation.vllm.warm_pass import draft_block_graphed_up_to
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    spec = _dspark_before_kv_init(monkeypatch, FlashAttentionBackend, "FULL_AND_PIECEWISE")
    assert draft_block_graphed_up_to(spec) == 64
    assert spec.query_cudagraph_manager is None  # read, never installed


@pytest.mark.parametrize("mode", ["PIECEWISE", "NONE"])
def test_before_kv_init_a_mode_without_full_decode_keeps_the_block(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    vllm_or_skip()
    from memest_instrumentation.vllm.warm_pass import draft_block_graphed_up_to
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    spec = _dspark_before_kv_init(monkeypatch, FlashAttentionBackend, mode)
    assert draft_block_graphed_up_to(spec) == 0


def test_before_kv_init_a_draft_backend_without_uniform_graphs_keeps_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vllm_or_skip()
    from memest_instrumentation.vllm.warm_pass import draft_block_graphed_up_to
    from vllm.v1.attention.backend import AttentionCGSupport

    class _NeverBuilder:
        @classmethod
        def get_cudagraph_support(cls, vllm_config: Any, spec: Any) -> Any:
            return AttentionCGSupport.NEVER

    backend = types.SimpleNamespace(get_builder_cls=lambda: _NeverBuilder)
    spec = _dspark_before_kv_init(monkeypatch, backend, "FULL_AND_PIECEWISE")
    assert draft_block_graphed_up_to(spec) == 0
