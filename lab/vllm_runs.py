#!/usr/bin/env python3
"""Real vLLM 0.33.0 on the lent H200: the memest plugin and the KV-budget validation.

One device script. The parent runs a group of vLLM starts, each in its own subprocess through
the carried launcher (.vllm_h200/vllm_h200_try.py: site unpacking, env, torchvision fallback),
and appends one JSON line per start to $OUT/results.jsonl as soon as it ends, so a timeout still
returns data. Each start is one configuration started one way:

- alone:  vLLM by itself (its own graph-memory estimate sizes the KV cache);
- default: MEMEST_ENABLE=1 and nothing else (the plugin's defaults; for the overhead);
- enable: MEMEST_ENABLE=1 with the allocator history kept (report + startup plan; vLLM's
          estimate still sizes the KV cache);
- apply:  MEMEST_ENABLE=1 MEMEST_ESTIMATE=apply (memest's full-init measurement sizes it);
- plan:   vLLM alone with VLLM_ENABLE_STARTUP_PLAN=1, reading the plan memest wrote;
- plandiag: the same plan start with MEMEST_ENABLE=1 MEMEST_ESTIMATE=off and the allocator
          history from init_device on, to see where a plan start's non-KV memory goes;
- fault:  MEMEST_ENABLE=1 with a hook made to raise and an unreachable service.

Usage at the end of init = device memory in use (total - cudaMemGetInfo free, after gc and
empty_cache) + the profile run's activation peak (vLLM's transient_peak_headroom, which serving's
first full-size batch needs again). Every start also measures that peak itself around the model
runner's profile_run (``own_headroom_bytes``: allocated peak minus allocated after): a plan start
still runs profile_run (to compile) but outside vLLM's memory_profiling, so vLLM reports none.
usage_minus_budget_bytes = usage - ceil(gpu_memory_utilization x total).

Run on the device from the repo root (carry [".vllm_h200"]):
    NCCL_NVLS_ENABLE=0 python3 lab/vllm_runs.py --group 1 --budget-s 560
Groups "moe" (Qwen3-MoE shape) and "mla" (DeepSeek-V2-Lite shape) register the torch stand-ins
of lab/vllm_op_standins.py in each start, for the compiled MoE / MLA ops the carry lacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python3 lab/X.py`: the repo root
from lab.carry import CACHE_ROOT, CARRY, ROOT, SITE, cache_env, launcher, plugin_site  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/memest_out"))
SHARED_TMP = Path(tempfile.gettempdir())

LLAMA = str(CARRY / "models" / "llama8b")
EAGLE3 = json.dumps(
    {"method": "eagle3", "model": str(CARRY / "models" / "eagle3_8b"), "num_speculative_tokens": 3}
)
EAGLE3_K5 = json.dumps(
    {"method": "eagle3", "model": str(CARRY / "models" / "eagle3_8b"), "num_speculative_tokens": 5}
)
# MoE and MLA shapes (8 layers each, dummy weights): their configs travel in the repo.
LAB_MODELS = ROOT / "lab" / "models"
# DSpark (vLLM's method "dspark"): the Qwen3DSparkModel draft (2 non-causal layers, Markov head
# of rank 256, anchor sampling: K = 7 query slots per request) on the 12-layer Qwen3-8B target.
# The draft's attention is named: left unset vLLM picks one for the non-causal draft itself
# (FLASH_ATTN on SM90, whose kernels the carry lacks); TRITON_ATTN takes non-causal queries and
# full CUDA graphs, so the drafter's FULL block routine is captured.
DSPARK_K7 = json.dumps(
    {
        "method": "dspark",
        "model": str(LAB_MODELS / "dspark_qwen3_8b_2l"),
        "num_speculative_tokens": 7,
        "attention_backend": "TRITON_ATTN",
    }
)
# MLA: TRITON_MLA decodes. On SM90 vLLM's only automatic prefill choice is FLASH_ATTN
# (platforms/interface.py get_mla_prefill_backend_cls), whose kernels the carry lacks: the
# stand-in `_vllm_fa2_C.varlen_fwd` (PyTorch's FlashAttention-2 kernel) serves it, as FA2 (vLLM
# pads v to the qk head dim for FA2; FA3, what a full install runs on SM90, does not).
# Calls 12 and 14 prefilled with "CPU" (CPUSDPAMLAPrefillBackend: float32 score matrices), which
# no GPU deployment selects; their L records are diagnostic.
MLA_ATTENTION = {"attention_backend": "TRITON_MLA", "mla_prefill_backend": "FLASH_ATTN"}
# A copy of an earlier memest tree (git archive), for before/after starts in one call.
OLD_TREE = ROOT / ".memest_old"
CACHE = CACHE_ROOT
MAX_MODEL_LEN = 4096
# vLLM 0.34's extensible KV cache sizing (extensible_kv_cache.measure_kv_cache_blocks)
SIZED_LINE = re.compile(r"(Memory after warmup: [^\n]*)")
# vLLM's own timing of the engine's init (profile, KV cache, warm-up and capture)
INIT_LINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)")
# DeepSeek-V3.2 with 4 of its 61 layers (lab/models/dsv32_4l) as the DSA starts run it; the
# comment at "S_dsv32_4l_s64_t2048" in CONFIGS says why each field.
DSA_START: dict[str, Any] = {
    "model": str(LAB_MODELS / "dsv32_4l"),
    "max_num_seqs": 64,
    "mbt": 2048,
    "util": 0.85,
    "standins": True,
    "dsa_standins": "fp32",
    "kernel_config": {"sparse_indexer_topk_backend": "per_row"},
    "attention_backend": "FLASHMLA_SPARSE",
    "sparse_mla_standin": True,
    # A prefill whose longest sequence fits the top-2,048 runs dense MHA (vLLM's
    # _use_dense_mha_prefill) through the MLA prefill backend vLLM picks on SM90,
    # FLASH_ATTN: served by the FA2 stand-in as for the dense MLA starts.
    "mla_prefill_backend": "FLASH_ATTN",
}

CONFIGS: dict[str, dict[str, Any]] = {
    "E_llama8b_eagle3k5_s96_t4096_u088": {
        "model": LLAMA,
        "max_num_seqs": 96,
        "mbt": 4096,
        "util": 0.88,
        "spec": EAGLE3_K5,
    },
    "A_llama8b_s128_t4096": {"model": LLAMA, "max_num_seqs": 128, "mbt": 4096, "util": 0.85},
    "B_llama8b_s32_t2048": {"model": LLAMA, "max_num_seqs": 32, "mbt": 2048, "util": 0.85},
    "C_llama8b_eagle3k3_s64_t4096": {
        "model": LLAMA,
        "max_num_seqs": 64,
        "mbt": 4096,
        "util": 0.85,
        "spec": EAGLE3,
    },
    "D_llama8b_s128_t4096_u070": {"model": LLAMA, "max_num_seqs": 128, "mbt": 4096, "util": 0.70},
    # The what-if's four grids from A (128 seqs / 4,096 tokens): max_num_seqs 4x fewer,
    # max_num_batched_tokens 2x, EAGLE3 K=3 added, capture sizes capped at 64.
    "W1_llama8b_s32_t4096": {"model": LLAMA, "max_num_seqs": 32, "mbt": 4096, "util": 0.85},
    "W2_llama8b_s128_t8192": {"model": LLAMA, "max_num_seqs": 128, "mbt": 8192, "util": 0.85},
    "W3_llama8b_eagle3k3_s128_t4096": {
        "model": LLAMA,
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "spec": EAGLE3,
    },
    "W4_llama8b_s128_t4096_cap64": {
        "model": LLAMA,
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "compilation": {"max_cudagraph_capture_size": 64},
    },
    # Qwen3-30B-A3B with 8 of its 48 layers: 128 experts, top-8, Triton fused MoE
    "M_qwen3moe8l_s64_t2048": {
        "model": str(LAB_MODELS / "qwen3moe_8l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
    },
    # Qwen3-8B with 12 of its 36 layers: a dense architecture outside the Llama family
    # (q/k norms), for the pre-flight's unseen-architecture check
    "Q_qwen3_8b12l_s64_t2048": {
        "model": str(LAB_MODELS / "qwen3_8b_12l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
    },
    # DeepSeek-V2-Lite with 8 of its 27 layers: MLA (kv_lora_rank 512), 64 experts, top-6;
    # prefill on the CPU SDPA backend (calls 12 and 14: diagnostic, see MLA_ATTENTION)
    "L_dsv2lite8l_s64_t2048": {
        "model": str(LAB_MODELS / "dsv2lite_8l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
        "attention_backend": "TRITON_MLA",
        "mla_prefill_backend": "CPU",
    },
    # the same with the FlashAttention prefill vLLM selects on SM90
    "L_dsv2lite8l_s64_t2048_fa": {
        "model": str(LAB_MODELS / "dsv2lite_8l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
        **MLA_ATTENTION,
    },
    # Production forms: the KV cache in FP8 (Triton attention writes and reads it), and an FP8
    # checkpoint's config (per-tensor weights, dynamic activation scales; dummy weights; the
    # carry has no CUTLASS, so vLLM's torch._scaled_mm kernel runs the linears).
    "F_llama8b_s128_t4096_fp8kv": {
        "model": LLAMA,
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "kv_cache_dtype": "fp8",
    },
    "Q8_llama8b_fp8w_s128_t4096": {
        "model": str(LAB_MODELS / "llama8b_fp8"),
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
        "fp8_standins": True,
    },
    # DeepSeek-V3.2 with 4 of its 61 layers, all dense (first_k_dense_replace 4: the indexer's
    # owners do not depend on the MoE): MLA plus the DSA indexer (64 heads of 128, top-2,048,
    # its FP8 key cache of 132 bytes per token). lab/dsa_standins.py serves DeepGEMM's MQA logits
    # and the indexer's compiled ops; top-k "per_row" (the compiled cooperative/persistent
    # top-k "auto" picks are missing too). logits_dtype "fp32" is the H200's own contract (one
    # FP32 logits tensor); "bf16" gives the SM100 pair: BF16 logits and vLLM's FP32 copy.
    # The sparse MLA attend is FlashMLA's (_flashmla_C), which the carry leaves out with every
    # other compiled extension: its torch stand-in serves it (lab/dsa_standins.py).
    "S_dsv32_4l_s64_t2048": DSA_START,
    "S_dsv32_4l_s64_t2048_bf16": {**DSA_START, "dsa_standins": "bf16"},
    # The SM100 pair at 65,536 positions: each FULL decode graph's logits are then up to
    # 64 x 65,536 x 2 B (8 MiB) plus vLLM's FP32 copy (16 MiB) per layer call, large enough to
    # open their own pool segments, as the seed's 10 GiB did at its grid. (The stand-in scores
    # one 64-token block per step, so the model's own 163,840 would capture 40x as many kernels.)
    "S_dsv32_4l_s64_t2048_m64k_bf16": {**DSA_START, "dsa_standins": "bf16", "max_model_len": 65536},
    # The DSA start with a context step whose requests' query lengths differ (the first 16 new
    # tokens, the rest 15): FlashMLA-sparse's metadata builder requires uniform decodes, so a
    # request whose query length differs from the first one's is a prefill (vLLM's
    # split_decodes_and_prefills), and one whose sequence fits the top-2,048 prefills by dense
    # MHA over its cached context (_compute_prefill_context). With uniform queries of at most
    # 256 tokens (128 heads on SM90) every request is a decode: the sparse MQA attend.
    "S_dsv32_4l_s64_t2048_ctxmix": {**DSA_START, "context_mixed_queries": True},
    # The DSA start with a context step that reaches the dense-MHA context chunk: vLLM's batch
    # reorder may put any request first, and call 38's mixed queries left one prefill. Here
    # every request's query length differs (1, 2, ... tokens over a prefix of whole 64-token
    # KV blocks, all of it a prefix-cache hit), so whichever request comes first is the one
    # decode and the other 16 prefill by dense MHA over 1,984 cached tokens each: one context
    # chunk of 31,744 rows, within the 32,768-row workspace.
    "S_dsv32_4l_s64_t2048_ctxdense": {
        **DSA_START,
        "context_distinct_queries": 17,
        "context_block": 64,
    },
    # 18 requests: 17 prefills over 1,984 cached tokens each, two chunks (vLLM cuts each
    # request's context at the workspace over the prefills, 32,768 // 17 rounded down to the
    # 64-token block: 1,920 tokens, so 32,640 rows, then 1,088).
    "S_dsv32_4l_s64_t2048_ctxdense18": {
        **DSA_START,
        "context_distinct_queries": 18,
        "context_block": 64,
    },
    # At 65,536 positions the chunk is 65,536 rows: 34 requests, 33 prefills over 1,984
    # cached tokens each (65,536 // 33 rounded down to the block: all 1,984 in one chunk of
    # 65,472 rows).
    "S_dsv32_4l_s64_t2048_m64k_bf16_ctxdense34": {
        **DSA_START,
        "dsa_standins": "bf16",
        "max_model_len": 65536,
        "context_distinct_queries": 34,
        "context_block": 64,
    },
    # DeepSeek-scale MLA and MoE breadth (issue 26), each with the FlashAttention prefill where
    # MLA and the step over cached context (32,768-row chunks at max_model_len 4,096).
    # DeepSeek-V3's attention (128 heads, q_lora_rank 1,536, kv_lora_rank 512) and layer mix: 3
    # dense layers (first_k_dense_replace), 2 MoE layers with 1 shared expert and top-8 of 64
    # routed experts (V3 has 256; the workspace and caches do not depend on the count); greedy
    # softmax routing, which the lab's stand-ins serve (V3's grouped sigmoid routing allocates
    # only [tokens, experts]-sized router tensors).
    "V3_dsv3mla5l_s64_t2048_fa": {
        "model": str(LAB_MODELS / "dsv3_5l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
        **MLA_ATTENTION,
    },
    # A second MLA shape: 64 heads, kv_lora_rank 256 (KV head size 320), q_lora_rank 768, dense MLP.
    "K_mla64h8l_s64_t2048_fa": {
        "model": str(LAB_MODELS / "mla64h_kv256_8l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
        **MLA_ATTENTION,
    },
    # Mixtral-class MoE with 4 of its 32 layers: 8 wide experts (intermediate 14,336), top-2.
    "X_mixtral4l_s64_t2048": {
        "model": str(LAB_MODELS / "mixtral_4l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
    },
    # DSpark K=7 on Qwen3-8B with 12 of its 36 layers: the draft logits per draft step and the
    # drafter's FULL block routine (45 graphs of 1 to 64 requests x 7 query slots, beside the
    # target's 51 PIECEWISE and 48 FULL decode graphs; tests/unit/plan/test_dspark_lab.py).
    "P_qwen3_8b12l_dspark7_s64_t2048": {
        "model": str(LAB_MODELS / "qwen3_8b_12l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,  # the grouped rms_norm of the draft's context-K norm
        "spec": DSPARK_K7,
    },
    # Grids no calibration saw: `vllm serve`'s defaults (1,024 seqs, 8,192 tokens, max_model_len
    # 8,192) and a wide prefill grid (256 seqs, 16,384 tokens), for the MoE and MLA shapes.
    "X_mixtral4l_s1024_t8192": {
        "model": str(LAB_MODELS / "mixtral_4l"),
        "max_num_seqs": 1024,
        "mbt": 8192,
        "max_model_len": 8192,
        "util": 0.85,
        "standins": True,
    },
    "X_mixtral4l_s256_t16384": {
        "model": str(LAB_MODELS / "mixtral_4l"),
        "max_num_seqs": 256,
        "mbt": 16384,
        "util": 0.85,
        "standins": True,
    },
    "K_mla64h8l_s1024_t8192_fa": {
        "model": str(LAB_MODELS / "mla64h_kv256_8l"),
        "max_num_seqs": 1024,
        "mbt": 8192,
        "max_model_len": 8192,
        "util": 0.85,
        "standins": True,
        **MLA_ATTENTION,
    },
    "K_mla64h8l_s256_t16384_fa": {
        "model": str(LAB_MODELS / "mla64h_kv256_8l"),
        "max_num_seqs": 256,
        "mbt": 16384,
        "util": 0.85,
        "standins": True,
        **MLA_ATTENTION,
    },
    # Hybrids: Gemma-3 class (5 sliding-window layers of 1,024 + 1 full, vocabulary 262,144) and
    # Qwen3-Next class (3 gated-delta-net linear-attention layers + 1 full, 512 experts top-10).
    # The context step's prefix (4,032 tokens) is longer than the sliding window.
    "G_gemma3_6l_s128_t4096": {
        "model": str(LAB_MODELS / "gemma3_6l"),
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
    },
    "N_qwen3next4l_s64_t2048": {
        "model": str(LAB_MODELS / "qwen3next_a3b_4l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": 0.85,
        "standins": True,
        # vLLM picks FlashInfer's GDN prefill on SM90, which the carry lacks: FLA's Triton kernels
        "additional_config": {"gdn_prefill_backend": "triton"},
    },
    # vLLM's own default utilization (0.34: 1.0 with its growable KV cache, sized from measured
    # memory after warm-up and capture), for a dense, an MoE and an MLA shape.
    "A_llama8b_s128_t4096_udef": {"model": LLAMA, "max_num_seqs": 128, "mbt": 4096, "util": None},
    "M_qwen3moe8l_s64_t2048_udef": {
        "model": str(LAB_MODELS / "qwen3moe_8l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": None,
        "standins": True,
    },
    "L_dsv2lite8l_s64_t2048_fa_udef": {
        "model": str(LAB_MODELS / "dsv2lite_8l"),
        "max_num_seqs": 64,
        "mbt": 2048,
        "util": None,
        "standins": True,
        **MLA_ATTENTION,
    },
    # Llama-3-8B with 4 of its 32 layers: a small model, where the plugin's fixed costs show.
    "T_llama8b4l_s128_t4096": {
        "model": str(LAB_MODELS / "llama8b_4l"),
        "max_num_seqs": 128,
        "mbt": 4096,
        "util": 0.85,
    },
}
#: Issue 26's shapes, each: memest apply (both steps' allocator history), its plan without and
#: with the plugin on (the plan path's profile run under vLLM's split limit), vLLM alone.
BIGMLA: dict[str, list[tuple[str, str]]] = {
    f"bigmla_{key}": [
        (config, mode) for mode in ("apply-hist-stephist", "plan", "plan-memest", "alone")
    ]
    for key, config in (
        ("v3", "V3_dsv3mla5l_s64_t2048_fa"),
        ("k", "K_mla64h8l_s64_t2048_fa"),
        ("x", "X_mixtral4l_s64_t2048"),
    )
}
# vLLM alone and the plugin's defaults, alternating warm starts of A (startup overhead).
ALTERNATING = [("A_llama8b_s128_t4096", "alone"), ("A_llama8b_s128_t4096", "default")] * 3
GROUPS: dict[str, list[tuple[str, str]]] = {
    "1": [
        ("A_llama8b_s128_t4096", "apply"),
        ("A_llama8b_s128_t4096", "alone"),
        ("A_llama8b_s128_t4096", "enable"),
        ("A_llama8b_s128_t4096", "plan"),
        ("D_llama8b_s128_t4096_u070", "alone"),
        ("D_llama8b_s128_t4096_u070", "apply"),
        ("D_llama8b_s128_t4096_u070", "plan"),
        ("A_llama8b_s128_t4096", "fault"),
    ],
    "2": [
        ("C_llama8b_eagle3k3_s64_t4096", "apply"),
        ("C_llama8b_eagle3k3_s64_t4096", "alone"),
        ("C_llama8b_eagle3k3_s64_t4096", "plan"),
        ("B_llama8b_s32_t2048", "apply"),
        ("B_llama8b_s32_t2048", "alone"),
        ("B_llama8b_s32_t2048", "plan"),
        ("C_llama8b_eagle3k3_s64_t4096", "enable"),
    ],
    "3": [
        ("D_llama8b_s128_t4096_u070", "plan"),
        ("A_llama8b_s128_t4096", "fault"),
    ],
    "4": [
        ("C_llama8b_eagle3k3_s64_t4096", "alone"),
        ("C_llama8b_eagle3k3_s64_t4096", "apply"),
        ("C_llama8b_eagle3k3_s64_t4096", "enable"),
        ("C_llama8b_eagle3k3_s64_t4096", "plan"),
        ("A_llama8b_s128_t4096", "apply"),
        ("A_llama8b_s128_t4096", "enable"),
        ("A_llama8b_s128_t4096", "alone"),
    ],
    "5": [
        ("C_llama8b_eagle3k3_s64_t4096", "enable"),
        ("C_llama8b_eagle3k3_s64_t4096", "plan"),
        ("C_llama8b_eagle3k3_s64_t4096", "plandiag"),
        ("B_llama8b_s32_t2048", "alone"),
        ("B_llama8b_s32_t2048", "apply"),
        ("B_llama8b_s32_t2048", "enable"),
        ("B_llama8b_s32_t2048", "plan"),
        ("C_llama8b_eagle3k3_s64_t4096", "alone"),
    ],
    "6": [
        ("C_llama8b_eagle3k3_s64_t4096", "enable"),
        ("C_llama8b_eagle3k3_s64_t4096", "plan"),
        ("C_llama8b_eagle3k3_s64_t4096", "apply"),
        ("B_llama8b_s32_t2048", "enable"),
        ("B_llama8b_s32_t2048", "plan"),
        ("B_llama8b_s32_t2048", "apply"),
        ("D_llama8b_s128_t4096_u070", "apply"),
        ("D_llama8b_s128_t4096_u070", "plan"),
        ("C_llama8b_eagle3k3_s64_t4096", "alone"),
        ("B_llama8b_s32_t2048", "alone"),
    ],
    "7": [
        ("C_llama8b_eagle3k3_s64_t4096", "apply"),
        ("C_llama8b_eagle3k3_s64_t4096", "plan"),
        ("D_llama8b_s128_t4096_u070", "apply"),
        ("D_llama8b_s128_t4096_u070", "plan"),
        ("B_llama8b_s32_t2048", "apply"),
        ("B_llama8b_s32_t2048", "plan"),
        ("D_llama8b_s128_t4096_u070", "alone"),
    ],
    "grids_hybrid": [
        ("X_mixtral4l_s1024_t8192", "apply"),
        ("K_mla64h8l_s1024_t8192_fa", "apply"),
        ("G_gemma3_6l_s128_t4096", "alone"),
        ("N_qwen3next4l_s64_t2048", "alone"),
    ],
    "grids_wide": [
        ("X_mixtral4l_s256_t16384", "apply"),
        ("K_mla64h8l_s256_t16384_fa", "apply"),
        ("X_mixtral4l_s1024_t8192", "alone"),
    ],
    # with MEMEST_LAB_CARRY=.vllm_h200_034: vLLM 0.34.0 alone at its defaults
    "v034_alone": [
        ("A_llama8b_s128_t4096_udef", "alone"),
        ("M_qwen3moe8l_s64_t2048_udef", "alone"),
        ("L_dsv2lite8l_s64_t2048_fa_udef", "alone"),
    ],
    # vLLM 0.33.0: the hybrids with memest (Gemma-3 class), Qwen3-Next on FLA's GDN prefill
    "hybrid_apply": [
        ("G_gemma3_6l_s128_t4096", "apply"),
        ("N_qwen3next4l_s64_t2048", "alone"),
    ],
    # with MEMEST_LAB_CARRY=.vllm_h200_034: memest apply and its plan, dense, MoE and MLA
    # (vLLM 0.34.0 alone at the dense shape: call 47)
    "v034_apply": [
        ("A_llama8b_s128_t4096_udef", "apply"),
        ("A_llama8b_s128_t4096_udef", "plan"),
        ("M_qwen3moe8l_s64_t2048_udef", "alone"),
        ("M_qwen3moe8l_s64_t2048_udef", "apply"),
        ("L_dsv2lite8l_s64_t2048_fa_udef", "alone"),
        ("L_dsv2lite8l_s64_t2048_fa_udef", "apply"),
    ],
    # with MEMEST_LAB_CARRY=.vllm_h200_034: memest apply again with MLA's context in its
    # transient (the MLA start) and the prompt-logprobs chunk (both)
    "v034_recheck": [
        ("L_dsv2lite8l_s64_t2048_fa_udef", "apply"),
        ("A_llama8b_s128_t4096_udef", "apply"),
    ],
    # vLLM 0.33.0: the Gemma-3 class's memest apply and the plan it writes
    "hybrid_g_plan": [
        ("G_gemma3_6l_s128_t4096", "apply"),
        ("G_gemma3_6l_s128_t4096", "plan"),
    ],
    # vLLM 0.33.0: Qwen3-Next class alone, then memest apply (FLA's GDN prefill compiles long)
    "hybrid_n": [
        ("N_qwen3next4l_s64_t2048", "alone"),
        ("N_qwen3next4l_s64_t2048", "apply"),
    ],
    # vLLM 0.33.0: the hybrids with memest apply and plan, Qwen3-Next alone first
    "hybrid_plan": [
        ("G_gemma3_6l_s128_t4096", "apply"),
        ("G_gemma3_6l_s128_t4096", "plan"),
        ("N_qwen3next4l_s64_t2048", "alone"),
        ("N_qwen3next4l_s64_t2048", "apply"),
        ("N_qwen3next4l_s64_t2048", "plan"),
    ],
    # vLLM 0.33.0: the Qwen3-Next class with the GDN prefill term and the in-place
    # silu_and_mul, apply then the plan it writes; EAGLE3 at serving's full-batch step
    "gdn_eagle3": [
        ("N_qwen3next4l_s64_t2048", "apply"),
        ("N_qwen3next4l_s64_t2048", "plan"),
        ("C_llama8b_eagle3k3_s64_t4096", "apply"),
        ("W3_llama8b_eagle3k3_s128_t4096", "apply"),
    ],
    # with MEMEST_LAB_CARRY=.vllm_h200_034: vLLM 0.34.0 alone and memest apply, dense
    "v034_dense": [
        ("A_llama8b_s128_t4096_udef", "alone"),
        ("A_llama8b_s128_t4096_udef", "apply"),
    ],
    "smoke": [("B_llama8b_s32_t2048", "enable")],
    # Owners under torch.compile (allocator history kept, map of generated code in the report):
    # a cold Llama-8B start, the same warm (compile-cache hit: same owner table), EAGLE3 K=3 and
    # the Qwen3-MoE shape. Then: python lab/owner_table.py (see its docstring).
    "owners": [
        ("A_llama8b_s128_t4096", "enable-cold"),
        ("A_llama8b_s128_t4096", "enable"),
        ("C_llama8b_eagle3k3_s64_t4096", "enable"),
        ("M_qwen3moe8l_s64_t2048", "enable"),
    ],
    # What-if from one start (A, history kept for the replay) to four real grids, each sized by
    # memest apply; then python lab/whatif_real.py (see its docstring).
    "whatif": [
        ("A_llama8b_s128_t4096", "enable-cold"),
        ("W1_llama8b_s32_t4096", "apply"),
        ("W2_llama8b_s128_t8192", "apply"),
        ("W3_llama8b_eagle3k3_s128_t4096", "apply"),
        ("W4_llama8b_s128_t4096_cap64", "apply"),
    ],
    # MoE, then MLA + MoE: alone first (a failed start skips the rest of its configuration).
    "moe": [
        ("M_qwen3moe8l_s64_t2048", "alone"),
        ("M_qwen3moe8l_s64_t2048", "apply"),
        ("M_qwen3moe8l_s64_t2048", "plan"),
    ],
    "mla": [
        ("L_dsv2lite8l_s64_t2048", "alone"),
        ("L_dsv2lite8l_s64_t2048", "apply"),
        ("L_dsv2lite8l_s64_t2048", "plan"),
    ],
    # Reach: MoE, MLA + MoE and a dense Qwen3, each vLLM alone then memest apply with the
    # allocator history kept (owners of MoE workspaces and MLA caches); plans last. A failed
    # start skips the rest of its configuration only.
    "reach": [
        ("M_qwen3moe8l_s64_t2048", "alone"),
        ("M_qwen3moe8l_s64_t2048", "apply-hist"),
        ("L_dsv2lite8l_s64_t2048", "alone"),
        ("L_dsv2lite8l_s64_t2048", "apply-hist"),
        ("Q_qwen3_8b12l_s64_t2048", "alone"),
        ("Q_qwen3_8b12l_s64_t2048", "apply-hist"),
        ("M_qwen3moe8l_s64_t2048", "plan"),
        ("L_dsv2lite8l_s64_t2048", "plan"),
    ],
    # Owners warm (after the what-if group's cold enable start of A: cold = warm), EAGLE3 K=3,
    # then alternating warm starts for the plugin's default overhead.
    "owners2": [
        ("A_llama8b_s128_t4096", "enable"),
        ("C_llama8b_eagle3k3_s64_t4096", "enable"),
        *ALTERNATING,
    ],
    # W2 again with its step filled to 8,191 tokens (two prompts), then the MoE shape compiled
    # with memest on (map of generated code recorded) and the step's allocator history kept.
    "redo": [
        ("W2_llama8b_s128_t8192", "apply-cold"),
        ("M_qwen3moe8l_s64_t2048", "apply-hist-cold-stephist"),
    ],
    # Startup overhead of the plugin's defaults: alternating warm starts (the first compiles).
    "overhead": ALTERNATING,
    # The MoE shape again with the stand-in moe_sum that allocates nothing, and the MLA shape
    # with the FlashAttention prefill: each vLLM alone, memest apply (history kept), its plan.
    "verify": [
        ("M_qwen3moe8l_s64_t2048", "alone"),
        ("M_qwen3moe8l_s64_t2048", "apply-hist"),
        ("L_dsv2lite8l_s64_t2048_fa", "alone"),
        ("L_dsv2lite8l_s64_t2048_fa", "apply-hist"),
        ("M_qwen3moe8l_s64_t2048", "plan"),
        ("L_dsv2lite8l_s64_t2048_fa", "plan"),
    ],
    # The MLA shape with a step over cached context after the first full-size step (every
    # start runs it; MLA up-projects that context in its chunked-prefill workspace), then the
    # MoE shape's apply start again with it.
    "context": [
        ("L_dsv2lite8l_s64_t2048_fa", "alone"),
        ("L_dsv2lite8l_s64_t2048_fa", "apply-hist"),
        ("L_dsv2lite8l_s64_t2048_fa", "plan"),
        ("M_qwen3moe8l_s64_t2048", "apply-hist"),
    ],
    # The MLA shape with memest's term for prefill over cached context (apply, then its plan).
    "mla2": [
        ("L_dsv2lite8l_s64_t2048_fa", "apply-hist"),
        ("L_dsv2lite8l_s64_t2048_fa", "plan"),
    ],
    # The MLA shape with memest's warm pass run without vLLM's context stand-in (both steps'
    # allocator history kept), then the plan that start wrote.
    "mla3": [
        ("L_dsv2lite8l_s64_t2048_fa", "apply-hist-stephist"),
        ("L_dsv2lite8l_s64_t2048_fa", "plan"),
    ],
    # The MLA shape with memest's term for its prefill up-projection (a full step's new tokens
    # and one cached-context chunk): memest apply, the plan it wrote, vLLM alone.
    "mla4": [
        ("L_dsv2lite8l_s64_t2048_fa", "apply"),
        ("L_dsv2lite8l_s64_t2048_fa", "plan"),
        ("L_dsv2lite8l_s64_t2048_fa", "alone"),
    ],
    # Production (issue 25): a compile cache filled without memest, then a memest start that
    # loads it (owners on a cache hit); the FP8 KV cache (apply, plan, alone); an FP8 checkpoint.
    "prod": [
        ("A_llama8b_s128_t4096", "alone-cold"),
        ("A_llama8b_s128_t4096", "enable"),
        ("F_llama8b_s128_t4096_fp8kv", "apply"),
        ("F_llama8b_s128_t4096_fp8kv", "plan"),
        ("F_llama8b_s128_t4096_fp8kv", "alone"),
        ("Q8_llama8b_fp8w_s128_t4096", "alone"),
    ],
    # The 4-layer shape: a compile cache filled without memest, a memest start that loads it
    # (owners rebuilt from vLLM's cache), then alternating warm starts: vLLM alone and the
    # plugin's defaults (startup overhead on a small model).
    "small": [
        ("T_llama8b4l_s128_t4096", "alone-cold"),
        ("T_llama8b4l_s128_t4096", "enable"),
        *[("T_llama8b4l_s128_t4096", "default"), ("T_llama8b4l_s128_t4096", "alone")] * 4,
    ],
    # Owners on a compile-cache hit (issue 25): a cold start without memest fills vLLM's compile
    # cache (the cold flag clears it and the code-map dir), then a memest start loads it; its
    # module map is rebuilt from the cache's computation_graph.py.
    "cachehit": [
        ("A_llama8b_s128_t4096", "alone-cold"),
        ("A_llama8b_s128_t4096", "enable"),
    ],
    # Issue 29: the DSA indexer's logits in real vLLM (SM90's FP32 logits, then the SM100 pair
    # on the same GPU), memest apply beside vLLM alone.
    "dsa": [
        ("S_dsv32_4l_s64_t2048", "enable"),
        ("S_dsv32_4l_s64_t2048", "apply"),
        ("S_dsv32_4l_s64_t2048", "alone"),
        ("S_dsv32_4l_s64_t2048_bf16", "enable"),
        ("S_dsv32_4l_s64_t2048_bf16", "apply"),
    ],
    # Issue 29: DSpark's draft logits and its block routine's graphs in real vLLM, memest apply
    # beside vLLM alone, and the plan memest wrote.
    "dspark": [
        ("P_qwen3_8b12l_dspark7_s64_t2048", "enable"),
        ("P_qwen3_8b12l_dspark7_s64_t2048", "apply"),
        ("P_qwen3_8b12l_dspark7_s64_t2048", "alone"),
        ("P_qwen3_8b12l_dspark7_s64_t2048", "plan"),
    ],
    # The DSA start's step over cached context both ways: uniform queries (decodes, the sparse
    # attend) and queries that differ (prefills, dense MHA over the cached context).
    "dsa_ctx": [
        ("S_dsv32_4l_s64_t2048_ctxmix", "alone-stephist"),
        ("S_dsv32_4l_s64_t2048", "alone-stephist"),
    ],
    # Both of issue 29's shapes in one device call: memest apply with the allocator history
    # kept (the owners and the size law) and vLLM alone, then the SM100 logits pair.
    "dsa_dspark": [
        ("S_dsv32_4l_s64_t2048", "apply-hist"),
        ("S_dsv32_4l_s64_t2048", "alone"),
        ("P_qwen3_8b12l_dspark7_s64_t2048", "apply-hist"),
        ("P_qwen3_8b12l_dspark7_s64_t2048", "alone"),
        ("S_dsv32_4l_s64_t2048_bf16", "apply-hist"),
    ],
    # Issue 29's second DSA call: the SM100 pair at 65,536 positions (owners and their size
    # law), vLLM alone beside it, then the DSpark apply start the warm-pass fix changes.
    "dsa2": [
        ("S_dsv32_4l_s64_t2048_m64k_bf16", "apply-hist"),
        ("S_dsv32_4l_s64_t2048_m64k_bf16", "alone"),
        ("P_qwen3_8b12l_dspark7_s64_t2048", "apply"),
    ],
    # The DSpark start's memest apply alone: the warm profile pass without the drafter's block
    # routine its FULL graphs cover (the -0.119 GiB of call 30).
    "dspark_apply": [("P_qwen3_8b12l_dspark7_s64_t2048", "apply")],
    # The DSA start's dense-MHA context chunk reached (memest apply with the step histories,
    # vLLM alone), then V3's apply and the plan it writes with the plugin on, whose end-of-init
    # readings now carry the serving stream's free bytes and the auxiliary stream's allocations.
    # The widest dense context chunk a prefix-cached DSA step reaches, then the plans the
    # plugin writes for Mixtral and the 64-head MLA shape with the per-stream readings.
    # The dense chunk at 65,536 positions (memest apply with the step histories, vLLM alone).
    "dsa_ctxdense_m64k": [
        ("S_dsv32_4l_s64_t2048_m64k_bf16_ctxdense34", "apply-stephist"),
        ("S_dsv32_4l_s64_t2048_m64k_bf16_ctxdense34", "alone"),
    ],
    "dsa_ctxdense18_plans": [
        ("S_dsv32_4l_s64_t2048_ctxdense18", "apply-stephist"),
        ("S_dsv32_4l_s64_t2048_ctxdense18", "alone"),
        ("X_mixtral4l_s64_t2048", "apply"),
        ("X_mixtral4l_s64_t2048", "plan-memest"),
        ("K_mla64h8l_s64_t2048_fa", "apply"),
        ("K_mla64h8l_s64_t2048_fa", "plan-memest"),
    ],
    "dsa_ctxdense_v3plan": [
        ("S_dsv32_4l_s64_t2048_ctxdense", "apply-stephist"),
        ("S_dsv32_4l_s64_t2048_ctxdense", "alone"),
        ("V3_dsv3mla5l_s64_t2048_fa", "apply"),
        ("V3_dsv3mla5l_s64_t2048_fa", "plan-memest"),
    ],
    # An FP8 checkpoint (lab/fp8_standins.py quantizes): vLLM alone, memest apply, its plan.
    "fp8w": [
        ("Q8_llama8b_fp8w_s128_t4096", "apply"),
        ("Q8_llama8b_fp8w_s128_t4096", "alone"),
        ("Q8_llama8b_fp8w_s128_t4096", "plan"),
    ],
    # The plugin's defaults against vLLM alone: one start to fill the compile cache, then
    # alternating warm starts.
    "overhead2": [("A_llama8b_s128_t4096", "alone"), *ALTERNATING],
    # DeepSeek-scale MLA and MoE breadth (issue 26): per shape memest apply with the allocator
    # history of both steps, the plan it wrote, vLLM alone; one shape per device call
    # (bigmla_v3, bigmla_k, bigmla_x), or all three in one longer session (bigmla).
    **BIGMLA,
    "bigmla": [start for starts in BIGMLA.values() for start in starts],
    # DeepSeek-V3's mix: memest apply writes the plan, then the plan start with the allocator
    # history from init and of its first steps (which streams its warm-up and serving run on).
    "bigmla_v3plan": [
        ("V3_dsv3mla5l_s64_t2048_fa", "apply"),
        ("V3_dsv3mla5l_s64_t2048_fa", "plandiag-stephist"),
    ],
    # The reported stall (cold apply start, EAGLE3 K=5): the earlier tree, then this one.
    "9": [
        ("E_llama8b_eagle3k5_s96_t4096_u088", "apply-cold-old"),
        ("E_llama8b_eagle3k5_s96_t4096_u088", "alone"),
        ("E_llama8b_eagle3k5_s96_t4096_u088", "apply"),
    ],
    "8": [
        ("E_llama8b_eagle3k5_s96_t4096_u088", "apply-cold-old"),
        ("E_llama8b_eagle3k5_s96_t4096_u088", "apply-cold"),
        ("E_llama8b_eagle3k5_s96_t4096_u088", "plan"),
        ("E_llama8b_eagle3k5_s96_t4096_u088", "alone"),
    ],
}


# --------------------------------------------------------------------------- child
def _worker(llm: Any) -> Any:
    core = llm.llm_engine.engine_core
    core = getattr(core, "engine_core", core)
    executor = core.model_executor
    wrapper = getattr(executor, "driver_worker", None)
    return getattr(wrapper, "worker", wrapper)


_OWN: dict[str, int] = {}


def _measure_profile_run() -> None:
    """Wrap the model runners' profile_run to read its transient peak, whoever calls it."""
    import torch

    for modname in ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner"):
        try:
            mod = importlib.import_module(modname)
        except Exception:
            continue
        for obj in vars(mod).values():
            if not (isinstance(obj, type) and "profile_run" in vars(obj)):
                continue
            orig = obj.profile_run

            # functools.wraps keeps vLLM's signature visible: memest checks it before patching.
            @functools.wraps(orig)
            def wrapped(self: Any, *a: Any, __orig: Any = orig, **k: Any) -> Any:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                out = __orig(self, *a, **k)
                torch.cuda.synchronize()
                _OWN["own_headroom_bytes"] = int(
                    torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
                )
                _OWN["profile_runs"] = _OWN.get("profile_runs", 0) + 1
                return out

            obj.profile_run = wrapped


_SNAPSHOT_S: list[float] = []


def _time_allocator_snapshots(torch: Any) -> None:
    """Log every allocator snapshot memest (or anyone) takes that lasts over 0.5 s.

    An allocator snapshot with traces converts the whole recorded history into Python objects;
    this shows what such calls cost inside a start (a periodic faulthandler dump crashed vLLM).
    """
    import traceback

    orig = torch._C._cuda_memorySnapshot

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = orig(*a, **k)
        dt = time.perf_counter() - t0
        _SNAPSHOT_S.append(round(dt, 3))
        if dt > 0.5:
            n = sum(len(t) for t in out.get("device_traces", []))
            caller = "".join(traceback.format_stack(limit=6)[:-1])
            print(f"SNAPSHOT {dt:.1f} s, {n} trace entries, from:\n{caller}", flush=True)
        return out

    torch._C._cuda_memorySnapshot = timed


def _serving_steps(
    llm: Any, cfg: dict[str, Any], used_end: int, reserved_end: int
) -> dict[str, Any]:
    """The three steps whose largest usage is serving's peak. A step that fails leaves the
    engine dead (a later generate() waits forever), so its error is printed at once and the
    steps after it are not run."""
    steps = (
        lambda: _first_full_step(llm, cfg, used_end),
        lambda: _context_step(llm, cfg, used_end, reserved_end),
        lambda: _batch_step(llm, cfg, used_end, reserved_end),
    )
    out: dict[str, Any] = {}
    for run in steps:
        out.update(run())
        errors = {k: v for k, v in out.items() if k.endswith("step_error")}
        if errors:
            print(f"STEP FAILED {errors}; the steps after it are not run", flush=True)
            break
    return out


def _first_full_step(llm: Any, cfg: dict[str, Any], used_end: int) -> dict[str, Any]:
    """Serve max_num_batched_tokens - 1 prompt tokens in one step and read the device peak.

    That prefill is serving's first full-size step: the memory it needs beyond the end of init
    is the reservation the allocator adds (its cached free blocks are reused first) plus any
    memory outside PyTorch it adds. usage = in use at the end of init + that growth. A prompt
    holds at most max_model_len - 1 tokens, so a wider step is split into several prompts,
    which the scheduler batches into the one step. STEP_HISTORY=1 keeps the allocator history
    of the step beside the start's record, and of both steps after the context step.
    """
    import torch
    from vllm import SamplingParams

    n = int(cfg["mbt"]) - 1
    per_prompt = int(cfg.get("max_model_len", MAX_MODEL_LEN)) - 1
    lengths = [min(per_prompt, n - i) for i in range(0, n, per_prompt)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    reserved0 = torch.cuda.memory_reserved()
    free0, total = torch.cuda.mem_get_info()
    outside0 = (total - free0) - reserved0
    try:
        sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True)
        if os.environ.get("STEP_HISTORY") == "1":
            torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        prompts = [
            {"prompt_token_ids": [(7 * i + 13 * j) % 30000 + 10 for i in range(m)]}
            for j, m in enumerate(lengths)
        ]
        llm.generate(prompts, sp)
        if os.environ.get("STEP_HISTORY") == "1":  # recording goes on through the context step
            torch.cuda.memory._dump_snapshot(os.environ["STEP_HISTORY_PATH"])
    except Exception as exc:  # the figure is optional; the start's record is not
        return {"step_error": f"{type(exc).__name__}: {exc}"[:300]}
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    reserved1 = torch.cuda.memory_reserved()
    growth = int(torch.cuda.max_memory_reserved() - reserved0)
    outside = max(int((total - free1) - reserved1 - outside0), 0)
    return {
        "step_tokens": n,
        "step_prompts": len(lengths),
        "step_reserved_growth_bytes": growth,
        "step_outside_growth_bytes": outside,
        "step_usage_bytes": used_end + growth + outside,
    }


def _context_step(
    llm: Any, cfg: dict[str, Any], used_end: int, reserved_end: int
) -> dict[str, Any]:
    """A step of new tokens over cached context, after the first full-size step.

    Requests that share a prompt prefix already in the prefix cache (on by default) prefill only
    their new tokens, attending to the cached prefix as context. MLA reads that context back from
    the KV cache and up-projects it (`_compute_prefill_context` in mla_attention.py) in chunks of
    up to its chunked-prefill workspace size, min(max(8 x max_model_len, 4 x max_num_seqs x
    block size), 65,536) tokens; vLLM's profile pass reserves one [workspace, heads, nope + v]
    tensor for it. Here: one request puts a prefix of about max_num_batched_tokens tokens in the
    cache, then enough requests to fill one whole workspace chunk with it, 16 new tokens each,
    arrive together. usage = in use at the end of init + the reservation added since the end of
    init (both steps) + memory outside PyTorch added.
    """
    import torch

    block, new_tokens = int(cfg.get("context_block", 16)), 16
    max_model_len = int(cfg.get("max_model_len", MAX_MODEL_LEN))
    distinct = int(cfg.get("context_distinct_queries", 0))
    if distinct:  # request r: r + 1 new tokens, every sequence within the top-k
        requests, new_tokens = distinct, distinct
        prefix_len = (int(cfg["mbt"]) - distinct) // block * block
    else:
        prefix_len = min(max_model_len - 64, int(cfg["mbt"]) - new_tokens) // block * block
        workspace = min(max(8 * max_model_len, 4 * int(cfg["max_num_seqs"]) * block), 64 * 1024)
        requests = min(-(-workspace // prefix_len), int(cfg["max_num_seqs"]))
        requests = min(requests, (int(cfg["mbt"]) - 1) // new_tokens)
    prefix = [(11 * i) % 30000 + 10 for i in range(prefix_len)]
    sp = _greedy_one_token()

    def mixed(r: int) -> int:
        """Tokens fewer than new_tokens for request r: query lengths that differ."""
        if distinct:
            return distinct - (r + 1)
        return int(bool(cfg.get("context_mixed_queries")) and r > 0)

    try:
        llm.generate([{"prompt_token_ids": [*prefix, 5]}], sp)  # the prefix into the cache
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        free0, total = torch.cuda.mem_get_info()
        outside0 = (total - free0) - torch.cuda.memory_reserved()
        prompts = [
            {
                "prompt_token_ids": [
                    *prefix,
                    *[(r * new_tokens + j) % 997 + 20 for j in range(new_tokens - mixed(r))],
                ]
            }
            for r in range(requests)
        ]
        llm.generate(prompts, sp)
        if os.environ.get("STEP_HISTORY") == "1":  # both steps, from the first one's start
            path = os.environ["STEP_HISTORY_PATH"].replace(".step.", ".context_step.")
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None)
    except Exception as exc:  # the figure is optional; the start's record is not
        return {"context_step_error": f"{type(exc).__name__}: {exc}"[:300]}
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    reserved1 = torch.cuda.memory_reserved()
    growth = max(int(torch.cuda.max_memory_reserved()) - reserved_end, 0)
    outside = max(int((total - free1) - reserved1 - outside0), 0)
    return {
        "context_step_requests": requests,
        "context_step_context_tokens": requests * prefix_len,
        "context_step_new_tokens": requests * new_tokens - sum(mixed(r) for r in range(requests)),
        "context_step_reserved_growth_bytes": growth,
        "context_step_outside_growth_bytes": outside,
        "context_step_usage_bytes": used_end + growth + outside,
    }


def _batch_step_prompt(cfg: dict[str, Any]) -> list[int]:
    """The fanned-out prompt: long enough that the step's max_num_seqs prompts fill one whole
    prompt-logprobs chunk (memest.estimate.sampler.PROMPT_LOGPROBS_CHUNK_ROWS rows, or
    max_num_batched_tokens), the widest one serving scores, and no longer (at least 7 tokens)."""
    from memest.estimate.sampler import prompt_logprobs_rows

    n, mbt = int(cfg["max_num_seqs"]), int(cfg["mbt"])
    length = max(7, -(-prompt_logprobs_rows(mbt) // n))
    length = min(length, max(mbt // n, 1), int(cfg.get("max_model_len", MAX_MODEL_LEN)) - 2)
    return [11 + i % 997 for i in range(length)]


def _batch_step(llm: Any, cfg: dict[str, Any], used_end: int, reserved_end: int) -> dict[str, Any]:
    """One request fanned out to max_num_seqs sequences with vLLM's
    SamplingParams.for_sampler_warmup() options (the profile run's second sampler pass: float32
    logits with top-k/top-p/min-p, penalties, logit bias, logprobs), after the other steps: the
    step samples max_num_seqs rows at once. usage = in use at the end of init + the reservation
    added since the end of init (every step so far) + memory outside PyTorch this step added."""
    import torch
    from vllm import SamplingParams

    n = int(cfg["max_num_seqs"])
    base = SamplingParams.for_sampler_warmup()
    fields = (
        "temperature top_p top_k min_p frequency_penalty presence_penalty repetition_penalty "
        "min_tokens logit_bias logprobs prompt_logprobs"
    ).split()
    try:
        sp = SamplingParams(
            n=n,
            max_tokens=2,
            seed=0,
            ignore_eos=True,
            detokenize=False,
            **{f: getattr(base, f) for f in fields},
        )
        torch.cuda.synchronize()
        free0, total = torch.cuda.mem_get_info()
        outside0 = (total - free0) - torch.cuda.memory_reserved()
        llm.generate([{"prompt_token_ids": _batch_step_prompt(cfg)}], sp)
    except Exception as exc:  # the figure is optional; the start's record is not
        return {"batch_step_error": f"{type(exc).__name__}: {exc}"[:300]}
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    reserved1 = torch.cuda.memory_reserved()
    growth = max(int(torch.cuda.max_memory_reserved()) - reserved_end, 0)
    outside = max(int((total - free1) - reserved1 - outside0), 0)
    return {
        "batch_step_seqs": n,
        "batch_step_prompt_tokens": len(_batch_step_prompt(cfg)),
        "batch_step_reserved_growth_bytes": growth,
        "batch_step_outside_growth_bytes": outside,
        "batch_step_usage_bytes": used_end + growth + outside,
    }


def _kv_groups(worker: Any) -> Any:
    """vLLM's KV cache groups as this start built them (hybrid models have several): each
    group's spec type, layers, block size and page size, and the KV tensors' bytes."""
    try:
        runner = getattr(worker, "model_runner", worker)
        kcc = runner.kv_cache_config
        groups = [
            {
                "spec": type(g.kv_cache_spec).__name__,
                "layers": len(g.layer_names),
                "block_size": int(g.kv_cache_spec.block_size),
                "page_size_bytes": int(g.kv_cache_spec.page_size_bytes),
                "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None),
            }
            for g in kcc.kv_cache_groups
        ]
        tensors = [int(t.size) for t in kcc.kv_cache_tensors]
        return {
            "num_blocks": int(kcc.num_blocks),
            "groups": groups,
            "tensors": len(tensors),
            "tensor_bytes": sum(tensors),
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _kv_bytes(worker: Any, one_group: int) -> int:
    """The KV cache's bytes: vLLM's KV tensors all alias one buffer of bytes_per_block x
    num_blocks (v1/core/kv_cache_planning.py get_kv_cache_config_from_groups), so a hybrid
    model's groups share it; one group of layers is num_blocks x the layers' pages."""
    try:
        kcc = getattr(worker, "model_runner", worker).kv_cache_config
        return max(int(t.size) for t in kcc.kv_cache_tensors)
    except Exception:
        return one_group


def _without_msa_warmup() -> None:
    """vLLM 0.34's kernel_warmup imports minimax_m3_msa_warmup on CUDA for every model, and
    that module imports NVIDIA's CuTe DSL (`cutlass`), which the carry lacks; the warm-up only
    serves MiniMax-M3's sparse attention, so without the DSL it becomes a no-op."""
    if importlib.util.find_spec("cutlass") is not None:
        return
    import types

    name = "vllm.model_executor.warmup.minimax_m3_msa_warmup"
    module = types.ModuleType(name)
    module.minimax_m3_msa_warmup = lambda worker, *a, **k: None  # type: ignore[attr-defined]
    sys.modules[name] = module
    print(f"NO-OP {name}: no CuTe DSL (cutlass) here", flush=True)


def _vllm_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _resolved_utilization(cache: Any) -> float | None:
    """gpu_memory_utilization as vLLM resolved it (0.34: unset is 1.0 with the growable cache)."""
    resolved = getattr(cache, "resolved_gpu_memory_utilization", None)
    value = resolved if resolved is not None else getattr(cache, "gpu_memory_utilization", None)
    return float(value) if value is not None else None


def _extensible(worker: Any) -> Any:
    """vLLM 0.34's growable KV cache as this start sized it (None when off or absent)."""
    runner = getattr(worker, "model_runner", worker)
    kv = getattr(runner, "extensible_kv_cache", None)
    if kv is None:
        return None
    out: dict[str, Any] = {}
    for name in (
        "capacity_blocks",
        "num_committed_blocks",
        "bytes_per_block",
        "physical_bytes",
        "reserved_headroom_bytes",
        "torch_reserve_growth_bytes",
        "warmup_committable_blocks",
        "torch_memory_limit",
        "min_committed_blocks",
    ):
        try:
            value = getattr(kv, name)
            out[name] = int(value) if value is not None else None
        except Exception as exc:
            out[name] = f"{type(exc).__name__}"
    return out


def _greedy_one_token() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True)


def _provide_flash_attn(torch: Any) -> None:
    """FA2 for vLLM's FLASH_ATTN MLA prefill, checked on this GPU against the dense reference
    (bf16, MLA's 16 heads of 192, two causal sequences): the log shows the largest errors."""
    from lab.vllm_op_standins import _varlen_reference, provide_flash_attn_v2, varlen_fwd

    provide_flash_attn_v2()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(300, 16, 192, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    cu = torch.tensor([0, 100, 300], device="cuda", dtype=torch.int32)
    none4 = (None, None, None, None)  # seqused_k, leftpad_k, block_table, alibi_slopes
    out, lse = varlen_fwd(
        q,
        k,
        v,
        None,
        cu,
        cu,
        *none4,
        200,
        200,
        0.0,
        192**-0.5,
        False,
        True,
        -1,
        -1,
        0.0,
        False,
        0,
        None,
    )
    ref, ref_lse = _varlen_reference(q, k, v, cu, cu, 192**-0.5, True)
    err = (out.float() - ref.float()).abs().max().item()
    lse_err = (lse - ref_lse).abs().max().item()
    print(f"FA2STANDIN out_err={err:.4f} lse_err={lse_err:.5f} lse={tuple(lse.shape)}", flush=True)


def child(cfg_name: str, mode: str, result_path: Path) -> None:
    cfg = CONFIGS[cfg_name]
    carried = launcher()
    for key, value in cache_env().items():
        os.environ.setdefault(key, value)
    carried.set_env()
    carried.prepare_site(str(CARRY), str(SITE))
    import torch

    carried.ensure_torchvision()
    _without_msa_warmup()
    _time_allocator_snapshots(torch)
    from vllm import LLM

    if cfg.get("standins"):  # after the import: the shim has defined the _C schemas by then
        from lab.vllm_op_standins import register

        print(f"STANDINS {register()}", flush=True)
        if cfg.get("mla_prefill_backend") == "FLASH_ATTN":
            _provide_flash_attn(torch)
    if cfg.get("dsa_standins"):
        from dsa_standins import register as register_dsa

        dtype = torch.bfloat16 if cfg["dsa_standins"] == "bf16" else torch.float32
        sparse_mla = bool(cfg.get("sparse_mla_standin"))  # FlashMLA's attend in torch
        print(f"STANDINS {register_dsa(dtype, sparse_mla)}", flush=True)
    if cfg.get("fp8_standins"):
        from fp8_standins import register as register_fp8

        print(f"STANDINS {register_fp8()}", flush=True)
    _measure_profile_run()

    native = ["native"]
    kw: dict[str, Any] = dict(
        model=cfg["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=False,
        attention_backend=cfg.get("attention_backend", "TRITON_ATTN"),
        max_model_len=cfg.get("max_model_len", MAX_MODEL_LEN),
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["mbt"],
        seed=0,
        compilation_config={"custom_ops": ["none"], **cfg.get("compilation", {})},
        kernel_config={
            "ir_op_priority": {
                "rms_norm": native,
                "fused_add_rms_norm": native,
                "gelu_and_mul_sparse": native,
            },
            **cfg.get("kernel_config", {}),
        },
    )
    if cfg["util"] is not None:  # None: the installed vLLM's default (1.0 growable on 0.34)
        kw["gpu_memory_utilization"] = cfg["util"]
    if mode.startswith("plan") and CARRY.name.endswith("_034"):
        # 0.34 reads a startup plan only on its fixed-size path (gpu_worker: the growable cache
        # measures after capture instead)
        kw["enable_extensible_kv_cache"] = False
    if cfg.get("mla_prefill_backend"):
        kw["attention_config"] = {"mla_prefill_backend": cfg["mla_prefill_backend"]}
        if cfg["mla_prefill_backend"] == "FLASH_ATTN":
            kw["attention_config"]["flash_attn_version"] = 2  # the stand-in's version
    if cfg.get("additional_config"):
        kw["additional_config"] = cfg["additional_config"]
    if cfg.get("kv_cache_dtype"):
        kw["kv_cache_dtype"] = cfg["kv_cache_dtype"]
    if cfg.get("spec"):
        kw["speculative_config"] = json.loads(cfg["spec"])
    t0 = time.perf_counter()
    llm = LLM(**kw)
    start_s = time.perf_counter() - t0
    worker = _worker(llm)
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    end_torch = {
        "end_reserved_bytes": int(torch.cuda.memory_reserved()),
        "end_allocated_bytes": int(torch.cuda.memory_allocated()),
    }
    step = _serving_steps(llm, cfg, int(total - free), end_torch["end_reserved_bytes"])
    peak = getattr(worker, "peak_activation_memory", None)
    est = getattr(worker, "cudagraph_memory_estimate", None)
    headroom = None
    if peak is not None:
        applied = (
            est if os.environ.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1") != "0" else 0
        )
        headroom = int(peak) - int(applied or 0)
    cache = worker.cache_config
    specs = worker.get_kv_cache_spec()
    page_all = sum(int(s.page_size_bytes) for s in specs.values())
    block_size = int(next(iter(specs.values())).block_size)
    num_blocks = int(cache.num_gpu_blocks)
    from memest_instrumentation.vllm.state import state as memest_state

    st = memest_state()
    result = {
        "config": cfg_name,
        "mode": mode,
        "start_s": round(start_s, 2),
        "total_bytes": int(total),
        "requested_bytes": int(worker.requested_memory),
        "persistent_used_bytes": int(total - free),
        "headroom_bytes": headroom,
        "num_gpu_blocks": num_blocks,
        "block_size": block_size,
        "kv_page_bytes_all_layers": page_all,
        "kv_cache_dtype": str(getattr(cache, "cache_dtype", None)),
        "quantization": str(llm.llm_engine.vllm_config.model_config.quantization),
        "kv_bytes": _kv_bytes(worker, num_blocks * page_all),
        "kv_tokens": num_blocks * block_size,
        "kv_cache_memory_bytes_given": cache.kv_cache_memory_bytes,
        "vllm_cudagraph_estimate_bytes": est,
        "vllm_available_kv_bytes": getattr(worker, "available_kv_cache_memory_bytes", None),
        "memest_enabled": st.settings.enabled,
        "memest_plugin_registered": bool(st.run_id),
        "memest_hook_errors": list(st.hook_errors),
        "memest_apply_kv_bytes": st.apply_terms.memest_kv_bytes,
        "memest_plan": dataclasses.asdict(st.plan),
        "memest_figures": {**st.vllm.model_dump(), **dataclasses.asdict(st.figures)},
        "cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode),
        "memest_work_s": {k: round(v, 3) for k, v in getattr(st, "work_s", {}).items()},
        "memest_shed": getattr(st, "shed_reason", None),
        "memest_notes": list(st.notes)[-20:],
        "allocator_snapshot_s": {"count": len(_SNAPSHOT_S), "total": round(sum(_SNAPSHOT_S), 2)},
        "kv_groups": _kv_groups(worker),
        "vllm_version": _vllm_version(),
        "gpu_memory_utilization": _resolved_utilization(cache),
        "extensible_kv_cache": _extensible(worker),
        **_OWN,
        **end_torch,
        **step,
    }
    result_path.write_text(json.dumps(result, indent=1))
    print(f"RESULT {json.dumps(result)}", flush=True)
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------- parent
def run_group(group: str, budget_s: float, per_start_s: float) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "starts").mkdir(exist_ok=True)
    site = plugin_site()
    t_begin = time.monotonic()
    failed: set[str] = set()
    seen: dict[str, int] = {}
    for cfg_name, mode_spec in GROUPS[group]:
        if cfg_name in failed:
            print(f"SKIP {cfg_name}/{mode_spec}: an earlier start of it failed", flush=True)
            continue
        mode, *flags = mode_spec.split("-")
        tree = OLD_TREE if "old" in flags else ROOT
        pypath = os.pathsep.join(
            [str(tree), str(tree / "instrumentation"), str(site), os.environ.get("PYTHONPATH", "")]
        )
        if "cold" in flags:
            _clear_compile_cache()
        left = budget_s - (time.monotonic() - t_begin)
        if left < 45:
            print(f"SKIP {cfg_name}/{mode}: {left:.0f}s left", flush=True)
            continue
        # a configuration started the same way again in the group keeps its own files
        name = f"{cfg_name}.{mode_spec}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}.{seen[name]}"
        env = dict(os.environ)
        env["PYTHONPATH"] = pypath
        env["MEMEST_OUTPUT_DIR"] = str(OUT / "memest")
        env["MEMEST_RUN_ID"] = name
        env["PYTHONUNBUFFERED"] = "1"
        env["MEMEST_CODE_MAP_DIR"] = str(CACHE / "memest_code_maps")  # a cold start clears it
        env.pop("MEMEST_ENABLE", None)
        if mode == "default":  # the plugin as an operator turns it on, nothing else set
            env["MEMEST_ENABLE"] = "1"
        if mode in ("enable", "apply", "fault", "plandiag"):
            env["MEMEST_ENABLE"] = "1"
            env["MEMEST_ESTIMATE"] = "apply" if mode == "apply" else "plan"
        if mode in ("enable", "plandiag") or "hist" in flags:
            env["MEMEST_KEEP_SNAPSHOT"] = "1"
        if mode == "plandiag":
            env["MEMEST_ESTIMATE"] = "off"
            env["MEMEST_HISTORY_FROM"] = "init"
            env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
        if mode == "fault":
            env["MEMEST_FAULT"] = "capture_stage"
            env["MEMEST_SERVICE_URL"] = "http://127.0.0.1:9"
            env["MEMEST_PUSH_TIMEOUT_S"] = "3"
            env["MEMEST_ESTIMATE"] = "off"
        if mode == "plan":
            env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
            if "memest" in flags:  # the plugin on, measuring only: the plan path's profile run
                env["MEMEST_ENABLE"] = "1"  # under vLLM's split limit (MEMEST_PLAN_PATH_SPLIT)
                env["MEMEST_ESTIMATE"] = "off"
        if "stephist" in flags:
            env["STEP_HISTORY"] = "1"
            env["STEP_HISTORY_PATH"] = str(OUT / "starts" / f"{cfg_name}.{mode_spec}.step.pickle")
        res_path = OUT / "starts" / f"{name}.json"
        log_path = OUT / "starts" / f"{name}.log"
        cmd = [sys.executable, __file__, "--child", cfg_name, mode, str(res_path)]
        t0 = time.monotonic()
        rc: object
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run(
                    cmd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=min(per_start_s, left),
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        wall = time.monotonic() - t0
        rec: dict[str, Any] = {
            "config": cfg_name,
            "mode": mode_spec,
            "rc": rc,
            "wall_s": round(wall, 1),
        }
        init = INIT_LINE.search(log_path.read_text(errors="replace"))
        rec["engine_init_s"] = float(init.group(1)) if init else None
        if res_path.exists():
            rec.update(json.loads(res_path.read_text()))
            rec["mode"] = mode_spec
            h = rec.get("headroom_bytes")
            if h is None:
                h = rec.get("own_headroom_bytes")
                rec["headroom_from"] = "this start's profile_run" if h is not None else None
            util = CONFIGS[cfg_name]["util"] or rec.get("gpu_memory_utilization") or 1.0
            rec["budget_bytes"] = math.ceil(rec["total_bytes"] * util)
            sized = SIZED_LINE.findall(log_path.read_text(errors="replace"))
            rec["vllm_memory_after_warmup_line"] = sized[-1] if sized else None
            if h is not None:
                usage = rec["persistent_used_bytes"] + int(h)
                rec["usage_end_bytes"] = usage
                rec["usage_minus_budget_bytes"] = usage - rec["budget_bytes"]
            for kind in ("step", "context_step", "batch_step"):
                if rec.get(f"{kind}_usage_bytes") is not None:
                    usage = rec[f"{kind}_usage_bytes"]
                    rec[f"{kind}_usage_minus_budget_bytes"] = usage - rec["budget_bytes"]
        else:
            rec["log_tail"] = log_path.read_text()[-3000:]
            rec["slow_snapshots"] = _slow_snapshots(log_path)
            if "old" not in flags:
                failed.add(cfg_name)
                print(f"START FAILED {cfg_name}/{mode_spec}: {rec['log_tail']}", flush=True)
        with open(OUT / "results.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(
            f"DONE {cfg_name}/{mode_spec} rc={rc} wall={wall:.0f}s "
            f"umb={rec.get('usage_minus_budget_bytes')} "
            f"step_umb={rec.get('step_usage_minus_budget_bytes')} "
            f"context_umb={rec.get('context_step_usage_minus_budget_bytes')} "
            f"batch_umb={rec.get('batch_step_usage_minus_budget_bytes')} "
            f"kv_tokens={rec.get('kv_tokens')}",
            flush=True,
        )
    # startup plans memest wrote, for the record
    plans = CACHE / "startup_plan"
    if plans.exists():
        for p in plans.glob("*.json"):
            (OUT / "plans").mkdir(exist_ok=True)
            (OUT / "plans" / p.name).write_text(p.read_text())


def _clear_compile_cache() -> None:
    """A cold start: no torch.compile, Inductor or Triton cache (startup plans stay)."""
    import shutil

    if CACHE.exists():
        for entry in CACHE.iterdir():
            if entry.name != "startup_plan":
                shutil.rmtree(entry, ignore_errors=True)


def _slow_snapshots(log_path: Path) -> list[str]:
    """The SNAPSHOT lines of a start that did not finish: what its allocator snapshots cost."""
    lines = log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if line.startswith("SNAPSHOT ")][-40:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", default="1", choices=sorted(GROUPS))
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--per-start-s", type=float, default=240)
    ap.add_argument("--child", nargs=3, metavar=("CONFIG", "MODE", "RESULT"))
    args = ap.parse_args()
    if args.child:
        try:
            child(args.child[0], args.child[1], Path(args.child[2]))
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
        return
    run_group(args.group, args.budget_s, args.per_start_s)


if __name__ == "__main__":
    main()
