"""KV budget before any start: every full-initialization term predicted from config.json and the grid.

memest preflight (--model-config PATH/config.json | --model ID_OR_FOLDER [--revision REV])
                 --gpu h200 [--tensor-parallel-size N]
                 [--max-num-seqs N] [--max-num-batched-tokens N] [--max-model-len N]
                 [--gpu-memory-utilization F] [--speculative-config JSON]
                 [--compilation-config JSON] [--draft-model-config PATH] [--dtype DTYPE]
                 [--kv-cache-dtype DTYPE] [--quantization METHOD]
                 [--block-size N] [--attention-backend NAME] [--disable-custom-all-reduce]
                 [--env NAME=VALUE ...] [--vllm-version X.Y.Z] [--json]

Per rank: weights from the config's parameter shapes and dtype split by TP (FP8 checkpoints and
online FP8: the quantized linear layers at one byte per weight plus their scales, the rest in the
model's dtype, as vLLM 0.33.0 allocates them), the activation
headroom, memory outside PyTorch, graph pools (vLLM 0.33.0's capture plan, a synthetic per-graph
request trace replayed through the allocator model), runner buffers and profiling residue, each
with its uncertainty; vLLM 0.33.0's grid-sized buffers are computed as the what-if computes them
(memest.estimate.runner_buffers), each in the term of the phase that allocates it. Then the KV
budget, KV bytes, tokens and max concurrency (--kv-cache-dtype fp8: one byte per K and V
element), and the vLLM flag that gives each GPU that KV cache (--kv-cache-memory-bytes=N). The KV block
size is vLLM 0.33.0's for the attention backend (16 on an H200 unless --attention-backend FLASHMLA
(64) or FLASHINFER_MLA (32), or --block-size, says otherwise; 64 for a DSA model's sparse MLA,
whose indexer adds its key cache, weights, decode logits in FULL graphs and prefill logits
bound). Coefficients come
from measured starts on that GPU kind (reports/preflight/). An architecture, drafter or TP size
no start measured gets a wider range and a note; at TP > 1 the outside term holds what NCCL and
vLLM's all-reduce buffers take per rank (memest.estimate.parallel; --env passes the NCCL_* and
VLLM_ALLREDUCE_* variables that size them). Flags default as `vllm serve` does
(1024 seqs, 8192 batched tokens, utilization 0.9, max_model_len from the config).

--model takes what `vllm serve` takes: a model folder (its config.json) or a Hugging Face id, whose
config.json is read from the hub cache (HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub) at --revision (default main); nothing is downloaded (`hf download ID
config.json` puts it there).

--vllm-version picks the release whose rules apply (0.33.0 or 0.34.0; default: the installed
vLLM, else the newest supported). On 0.34.0 the result adds its growable KV cache: the KV bytes
vLLM 0.34's default sizing commits after capture (utilization unset: 1.0; its margin of
max(1 GiB, 0.75 x the transient peak) kept free) beside what memest's sizing would commit with
MEMEST_ENABLE=1 MEMEST_ESTIMATE=apply on the start.
"""

from __future__ import annotations

import argparse
from typing import Any

from memest.errors import CommandError
from memest.files import load_json_object
from memest.model_source import model_config_path
from memest.preflight import preflight, request_from
from memest.reporters.preflight import render


def _json_file(flag: str, path: str) -> dict[str, Any]:
    """A config.json given by path (never inline), refused in one line naming ``flag``."""
    return load_json_object(flag, path, error=CommandError, inline=False)


def _model_config(args: argparse.Namespace) -> dict[str, Any]:
    """--model-config's file, or the config.json of --model (its folder or the hub cache)."""
    if args.model_config is not None:
        return _json_file("--model-config", args.model_config)
    return _json_file("--model", str(model_config_path(args.model, args.revision)))


def _inline(flag: str, text: str | None) -> dict[str, Any] | None:
    return None if text is None else load_json_object(flag, text, error=CommandError)


def _environment(pairs: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` flags as a mapping, a pair without ``=`` refused in one line."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CommandError(f"--env: expected NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


class _Preflight:
    name = "preflight"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--model-config", metavar="PATH", help="config.json")
        source.add_argument(
            "--model",
            metavar="ID_OR_FOLDER",
            help="what vllm serve takes: a model folder, or a Hugging Face id read from the hub "
            "cache",
        )
        parser.add_argument(
            "--revision", default="main", help="with a Hugging Face --model: the revision (main)"
        )
        parser.add_argument("--gpu", default="h200", help="GPU kind of the calibration (h200)")
        parser.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N")
        parser.add_argument("--max-num-seqs", type=int, metavar="N")
        parser.add_argument("--max-num-batched-tokens", type=int, metavar="N")
        parser.add_argument("--max-model-len", type=int, metavar="N")
        parser.add_argument(
            "--gpu-memory-utilization",
            type=float,
            metavar="F",
            help="vLLM's flag (default 0.9 for the full-initialization budget; unset, vLLM "
            "0.34's growable cache sizes with 1.0)",
        )
        parser.add_argument("--speculative-config", metavar="JSON", help="vLLM's flag")
        parser.add_argument("--compilation-config", metavar="JSON", help="vLLM's flag")
        parser.add_argument(
            "--draft-model-config", metavar="PATH", help="the drafter's config.json"
        )
        parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float16, float32")
        parser.add_argument(
            "--kv-cache-dtype",
            default="auto",
            metavar="DTYPE",
            help="vLLM's flag: auto (the model's dtype), bfloat16, float16, fp8, fp8_e4m3, "
            "fp8_e5m2 (FP8: one byte per element)",
        )
        parser.add_argument(
            "--quantization",
            metavar="METHOD",
            help="vLLM's flag: fp8 (an FP8 checkpoint) or online fp8_per_tensor, "
            "fp8_per_channel, fp8_per_block (default: the config's quantization_config)",
        )
        parser.add_argument(
            "--block-size",
            type=int,
            metavar="N",
            help="vLLM's flag: KV block size in tokens (default: the attention backend's)",
        )
        parser.add_argument(
            "--attention-backend",
            metavar="NAME",
            help="vLLM's flag: FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLASH_ATTN_MLA, FLASHMLA, "
            "FLASHINFER_MLA, TRITON_MLA; sparse MLA (DSA): FLASH_ATTN_MLA_SPARSE, "
            "FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE_SM90 (default: vLLM's first for the GPU and "
            "attention kind)",
        )
        parser.add_argument(
            "--attention-config",
            metavar="JSON",
            help="vLLM's flag; read: flash_attn_version (2 pads MLA's v; default 3 on SM90)",
        )
        parser.add_argument(
            "--disable-custom-all-reduce",
            action="store_true",
            help="vLLM's flag (TP > 1): no custom all-reduce buffers",
        )
        parser.add_argument(
            "--env",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a variable the workers see that sizes TP's buffers (NCCL_BUFFSIZE, "
            "NCCL_MAX_NCHANNELS, VLLM_ALLREDUCE_USE_SYMM_MEM, ...); repeatable",
        )
        parser.add_argument(
            "--vllm-version",
            metavar="X.Y.Z",
            help="the vLLM release to predict for: 0.33.0 or 0.34.0 (default: the installed "
            "one, else the newest supported)",
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def run(self, args: argparse.Namespace) -> int:
        fields: dict[str, Any] = {
            "model_config": _model_config(args),
            "gpu": args.gpu,
            "tensor_parallel_size": args.tensor_parallel_size,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": args.max_model_len,
            "speculative_config": _inline("--speculative-config", args.speculative_config),
            "compilation_config": _inline("--compilation-config", args.compilation_config),
            "dtype": args.dtype,
            "kv_cache_dtype": args.kv_cache_dtype,
            "quantization": args.quantization,
            "block_size": args.block_size,
            "attention_backend": args.attention_backend,
            "attention_config": _inline("--attention-config", args.attention_config),
            "disable_custom_all_reduce": args.disable_custom_all_reduce,
            "environment": _environment(args.env),
        }
        if args.gpu_memory_utilization is not None:
            fields["gpu_memory_utilization"] = args.gpu_memory_utilization
        if args.vllm_version is not None:
            fields["vllm_version"] = args.vllm_version
        if args.draft_model_config:
            fields["draft_model_config"] = _json_file(
                "--draft-model-config", args.draft_model_config
            )
        result = preflight(request_from(fields))
        print(result.model_dump_json(indent=2) if args.json else render(result))
        return 0


COMMAND = _Preflight()
