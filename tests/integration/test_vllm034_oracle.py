"""vLLM 0.34.0 is the oracle for the sizing memest.plan.SIZING_BY_VERSION gives it (the seed's).

Calls 0.34.0's own ``VllmConfig._set_cudagraph_sizes`` (with a stand-in ``self`` carrying its
real helper methods, and a stand-in CUDA platform) on this CPU machine and compares, off SM100,
the five fields it resolves with ``memest.plan.seed.resolve_seed``: prefill token sizes, target
decode request sizes, the recorded maximum and the later draft steps' request sizes. The row's
documented differences (a prefill grid derived from max_prefill_cudagraph_capture_tokens, draft
steps and so the recorded maximum under explicit decode sizes, SM100's prefill grid) are left
out: the first is not in the grid, the second compares prefill and decode sizes only.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from typing import Any

import pytest

from memest.plan import SIZING_BY_VERSION
from memest.plan.inputs import PlanInput
from memest.plan.seed import resolve_seed
from memest.plan.vllm033 import vllm_sizes
from tests.conftest import require_or_skip

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_release("0.34.0")]

SEQS = (1, 8, 72, 128, 256, 512, 1024)
MNBT = (2048, 8192, 16384)
KS = (0, 1, 3, 5, 7)
COMPILATION: dict[str, dict[str, Any]] = {
    "default": {},
    "legacy max": {"max_cudagraph_capture_size": 1024},
    "legacy list": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]},
    "decode cap": {"max_decode_cudagraph_capture_requests": 64},
    "decode sizes": {"decode_cudagraph_capture_request_sizes": [1, 2, 4, 8, 16]},
    "decode budget": {"max_decode_cudagraph_capture_tokens": 2048},
    "prefill sizes": {"prefill_cudagraph_capture_token_sizes": [1, 64, 512, 2048]},
}
CONFIGS = list(itertools.product(SEQS, MNBT, KS, ("balanced", "interactivity"), COMPILATION))
#: vLLM's helper methods _set_cudagraph_sizes calls on self.
HELPERS = (
    "get_decode_cudagraph_query_lens",
    "_split_cudagraph_capture_sizes",
    "get_draft_decode_cudagraph_request_sizes",
    "get_varlen_decode_cudagraph_token_sizes",
)


@pytest.fixture(scope="module")
def vllm034() -> Iterator[types.SimpleNamespace]:
    try:
        import vllm.platforms as platforms
        from vllm.config.compilation import CompilationConfig, CUDAGraphMode
        from vllm.config.vllm import VllmConfig
    except ImportError:
        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM 0.34.0 is not installed")
        raise

    class StandInCuda:
        """What the sizing asks of the platform: the compute-capability family (not SM100)."""

        def is_device_capability_family(self, family: int) -> bool:
            return False

    saved = platforms._current_platform
    platforms._current_platform = StandInCuda()
    try:
        yield types.SimpleNamespace(
            VllmConfig=VllmConfig, CompilationConfig=CompilationConfig, CUDAGraphMode=CUDAGraphMode
        )
    finally:
        platforms._current_platform = saved


class StandInEagle3:
    enable_adaptive_verification = False
    method = "eagle3"
    num_speculative_tokens_per_batch_size = None

    def __init__(self, k: int) -> None:
        self.num_speculative_tokens = k

    def uses_dynamic_speculative_decoding(self) -> bool:
        return False

    def use_multi_module_mtp(self) -> bool:
        return False

    def use_gemma4_mtp(self) -> bool:
        return False


def _vllm_fields(
    env: types.SimpleNamespace, seqs: int, mnbt: int, k: int, perf: str, compilation: dict[str, Any]
) -> tuple[Any, ...]:
    cc = env.CompilationConfig(**compilation)
    cc.cudagraph_mode = env.CUDAGraphMode["FULL_AND_PIECEWISE"]
    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=False),
        compilation_config=cc,
        scheduler_config=types.SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=mnbt),
        speculative_config=None if k == 0 else StandInEagle3(k),
        num_speculative_tokens=k,
        uniform_decode_query_len=1 + k,
        performance_mode=perf,
        cache_config=types.SimpleNamespace(use_kda_recoverssm=False),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, data_parallel_size=1),
    )
    for name in HELPERS:
        setattr(cfg, name, types.MethodType(getattr(env.VllmConfig, name), cfg))
    env.VllmConfig._set_cudagraph_sizes(cfg)
    return (
        list(cc.prefill_cudagraph_capture_token_sizes),
        list(cc.decode_cudagraph_capture_request_sizes),
        int(cc.max_cudagraph_capture_size),
        list(cfg.get_draft_decode_cudagraph_request_sizes()),
    )


def _memest_fields(
    seqs: int, mnbt: int, k: int, perf: str, compilation: dict[str, Any]
) -> tuple[Any, ...]:
    inp = PlanInput(
        sm100=False,
        max_num_seqs=seqs,
        max_num_batched_tokens=mnbt,
        spec_method=None if k == 0 else "eagle3",
        num_speculative_tokens=k,
        performance_mode=perf,  # type: ignore[arg-type]
        **compilation,
    )
    seed = resolve_seed(inp, vllm_sizes(inp).main)
    fields = seed.resolved
    # Later draft steps exist with K >= 2 (EAGLE3 runs steps 1..K-1 as one-token decodes).
    steps = list(seed.one_token) if k >= 2 else []
    return (
        list(fields["prefill_cudagraph_capture_token_sizes"]),  # type: ignore[arg-type]
        list(fields["decode_cudagraph_capture_request_sizes"]),  # type: ignore[arg-type]
        seed.max_size,
        steps,
    )


def test_the_034_row_is_the_five_field_sizing() -> None:
    assert SIZING_BY_VERSION["0.34.0"] == "seed"


def test_the_five_fields_resolve_as_vllm_034_resolves_them(
    vllm034: types.SimpleNamespace,
) -> None:
    mismatches = []
    for seqs, mnbt, k, perf, name in CONFIGS:
        compilation = COMPILATION[name]
        expected = _vllm_fields(vllm034, seqs, mnbt, k, perf, dict(compilation))
        got = _memest_fields(seqs, mnbt, k, perf, compilation)
        if name == "decode sizes":
            # the documented difference: 0.34's draft steps take their own grid up to
            # max_num_seqs, which moves the recorded maximum with them
            expected, got = expected[:2], got[:2]
        if got != expected:
            mismatches.append(((seqs, mnbt, k, perf, name), got, expected))
    assert len(CONFIGS) >= 1000
    assert mismatches == []
