"""The lab's DSpark start: memest's capture plan against the graphs vLLM 0.33.0 would capture.

Configuration P_qwen3_8b12l_dspark7_s64_t2048 (lab/vllm_runs.py): the 12-layer Qwen3-8B target,
the Qwen3DSparkModel draft of lab/models/dspark_qwen3_8b_2l, K = 7, 64 sequences, 2,048 batched
tokens, an H200 (not compute-capability family 100), cudagraph_mode FULL_AND_PIECEWISE.

vLLM's counts are derived here by hand from its code:

- ``VllmConfig._set_cudagraph_sizes`` (config/vllm.py): off SM100 the ceiling is 512; the
  maximum is min(64 x (1 + 7) x 2, 512) = 512 (below 2,048 batched tokens). The list is 1, 2, 4,
  8..248 in steps of 8, 256..512 in steps of 16 (51 sizes); the uniform-decode sizes it adds,
  8 x {1, 2, 4, 8, 16, ..., 64}, are all in it already.
- The target's ``ModelCudaGraphManager`` (decode_query_len 1 + K = 8): one PIECEWISE graph per
  size, and a FULL uniform-decode graph per distinct ceil(size / 8) (the rounded size within
  64 x 8 and 512, the requests within 64).
- ``DSparkSpeculator`` (v1/worker/gpu/spec_decode/dspark/speculator.py): ``sample_from_anchor``
  (the draft config's, default True) makes num_query_per_req = K = 7, not DFlash's 1 + K.
  ``DFlashSpeculator.init_cudagraph_manager`` turns a FULL decode mode into
  FULL_DECODE_ONLY (the draft's TRITON_ATTN supports uniform-batch graphs), and
  ``DFlashCudaGraphManager`` is a ``CudaGraphManager`` with decode_query_len 7: one FULL graph
  per distinct ceil(size / 7) with the rounded size within 64 x 7 = 448 and 512, the requests
  within 64; no mixed graphs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from lab.vllm_runs import CONFIGS, LAB_MODELS
from memest.plan import PlanInput, resolve
from memest.schema.plan import CapturePlan

CONFIG = "P_qwen3_8b12l_dspark7_s64_t2048"

# cudagraph_capture_sizes as vLLM resolves them for 64 sequences, K = 7, off SM100 (above)
CAPTURE_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
# ceil(size / 8): 1, 2, 4 and 8 share one request; 16..248 give 2..31; 256..512 give 32..64 by 2
TARGET_DECODE_REQUESTS = [1, *range(2, 32), *range(32, 65, 2)]
# ceil(size / 7) for the 47 sizes up to 448 (1, 2 and 4 share one request); worked one by one:
# 8→2 16→3 ... 56→8, 64→10, 72→11, ..., 112→16, 120→18, ..., 168→24, 176→26, ..., 224→32,
# 232→34, 240→35, 248→36, 256→37, 272→39, 288→42, 304→44, 320→46, 336→48, 352→51, 368→53,
# 384→55, 400→58, 416→60, 432→62, 448→64
DRAFT_BLOCK_REQUESTS = [
    *range(1, 9),
    *range(10, 17),
    *range(18, 25),
    *range(26, 33),
    34,
    35,
    36,
    37,
    39,
    42,
    44,
    46,
    48,
    51,
    53,
    55,
    58,
    60,
    62,
    64,
]


def _vllm_uniform_decode_requests(
    sizes: Sequence[int], *, query_len: int, max_num_reqs: int, max_size: int
) -> list[int]:
    """The uniform-decode branch of vLLM's ``CudaGraphManager._init_candidates``, transcribed
    (one rank, no LoRA, no dynamic SD): the request count of each FULL descriptor, deduplicated."""
    max_decode_tokens = max_num_reqs * query_len
    requests: list[int] = []
    for num_tokens in sorted(sizes):
        rounded = -(-num_tokens // query_len) * query_len
        num_reqs = rounded // query_len
        if rounded > max_decode_tokens or rounded > max_size or num_reqs > max_num_reqs:
            continue
        if num_reqs not in requests:
            requests.append(num_reqs)
    return requests


def _plan() -> CapturePlan:
    cfg = CONFIGS[CONFIG]
    spec = json.loads(cfg["spec"])
    return resolve(
        PlanInput(
            sm100=False,
            gpu="h200",
            max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["mbt"],
            spec_method=spec["method"],
            num_speculative_tokens=spec["num_speculative_tokens"],
        ),
        "vllm-0.33.0",
    )


def _rows(plan: CapturePlan, runner: str) -> list[list[int]]:
    return [list(r.sizes) for r in plan.runners if r.runner == runner]


def test_the_lab_draft_samples_from_the_anchor_with_k_query_slots() -> None:
    spec = json.loads(CONFIGS[CONFIG]["spec"])
    draft = json.loads((LAB_MODELS / "dspark_qwen3_8b_2l" / "config.json").read_text())
    assert spec["method"] == "dspark" and spec["num_speculative_tokens"] == 7
    assert draft["architectures"] == ["Qwen3DSparkModel"]
    # vLLM reads getattr(hf_config, "sample_from_anchor", True): K slots, not 1 + K
    assert draft.get("sample_from_anchor", True) is True
    assert draft["block_size"] == spec["num_speculative_tokens"]


def test_the_hand_derivation_agrees_with_the_transcribed_manager_loop() -> None:
    assert len(CAPTURE_SIZES) == 51 and CAPTURE_SIZES[-1] == 512
    assert len(TARGET_DECODE_REQUESTS) == 48
    assert len(DRAFT_BLOCK_REQUESTS) == 45
    target = _vllm_uniform_decode_requests(
        CAPTURE_SIZES, query_len=8, max_num_reqs=64, max_size=512
    )
    draft = _vllm_uniform_decode_requests(CAPTURE_SIZES, query_len=7, max_num_reqs=64, max_size=512)
    assert target == TARGET_DECODE_REQUESTS
    assert draft == DRAFT_BLOCK_REQUESTS


def test_memest_plan_gives_vllms_graph_counts_for_the_lab_dspark_start() -> None:
    plan = _plan()
    assert plan.cudagraph_capture_sizes == CAPTURE_SIZES
    assert _rows(plan, "target.piecewise") == [CAPTURE_SIZES]
    assert _rows(plan, "target.full") == [TARGET_DECODE_REQUESTS]
    assert _rows(plan, "draft.block.full") == [DRAFT_BLOCK_REQUESTS]
    block = next(r for r in plan.runners if r.runner == "draft.block.full")
    assert (block.q, block.graph_mode, block.widest_requests, block.widest_tokens) == (
        7,
        "FULL",
        64,
        448,
    )
    assert plan.total_graphs == 51 + 48 + 45
