"""KV budget before any start: every full-initialization term predicted from config.json and the grid.

memest preflight --model-config PATH/config.json --gpu h200 [--tensor-parallel-size N]
                 [--max-num-seqs N] [--max-num-batched-tokens N] [--max-model-len N]
                 [--gpu-memory-utilization F] [--speculative-config JSON]
                 [--compilation-config JSON] [--draft-model-config PATH] [--dtype DTYPE]
                 [--kv-cache-dtype DTYPE] [--quantization METHOD]
                 [--block-size N] [--attention-backend NAME] [--disable-custom-all-reduce]
                 [--env NAME=VALUE ...] [--json]

Per rank: weights from the config's parameter shapes and dtype split by TP (FP8 checkpoints and
online FP8: the quantized linear layers at one byte per weight plus their scales, the rest in the
model's dtype, as vLLM 0.33.0 allocates them), the activation
headroom, memory outside PyTorch, graph pools (vLLM 0.33.0's capture plan, a synthetic per-graph
request trace replayed through the allocator model), runner buffers and profiling residue, each
with its uncertainty; vLLM 0.33.0's grid-sized buffers are computed as the what-if computes them
(memest.estimate.runner_buffers), each in the term of the phase that allocates it. Then the KV
budget, KV bytes, tokens and max concurrency (--kv-cache-dtype fp8: one byte per K and V
element). The KV block
size is vLLM 0.33.0's for the attention backend (16 on an H200 unless --attention-backend FLASHMLA
(64) or FLASHINFER_MLA (32), or --block-size, says otherwise; 64 for a DSA model's sparse MLA,
whose indexer adds its key cache, weights, decode logits in FULL graphs and prefill logits
bound). A hybrid (sliding-window, linear-attention or Mamba layers beside attention ones) gets
vLLM's KV-cache groups: tokens and max concurrency as vLLM logs them, and a table of each
group's blocks per request, share of the budget and tokens (memest.estimate.kv_groups); a layer
kind memest does not model is refused by name. Coefficients come
from measured starts on that GPU kind (reports/preflight/). An architecture, drafter or TP size
no start measured gets a wider range and a note; at TP > 1 the outside term holds what NCCL and
vLLM's all-reduce buffers take per rank (memest.estimate.parallel; --env passes the NCCL_* and
VLLM_ALLREDUCE_* variables that size them). Flags default as `vllm serve` does
(1024 seqs, 8192 batched tokens, utilization 0.9, max_model_len from the config).
"""

from __future__ import annotations

import argparse
from typing import Any

from memest.errors import CommandError
from memest.estimate.kv_groups import Lengths, group_rows
from memest.estimate.phases import TERM_LABELS
from memest.files import load_json_object
from memest.preflight import preflight, request_from
from memest.preflight.calibration import overshoot_line
from memest.reporters.kv_groups import kv_groups_table
from memest.reporters.table import text_lines
from memest.schema.preflight import PreflightResult
from memest.units import concurrency_text, fmt_gib


def _json_file(flag: str, path: str) -> dict[str, Any]:
    """A config.json given by path (never inline), refused in one line naming ``flag``."""
    return load_json_object(flag, path, error=CommandError, inline=False)


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
        parser.add_argument("--model-config", required=True, metavar="PATH", help="config.json")
        parser.add_argument("--gpu", default="h200", help="GPU kind of the calibration (h200)")
        parser.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N")
        parser.add_argument("--max-num-seqs", type=int, metavar="N")
        parser.add_argument("--max-num-batched-tokens", type=int, metavar="N")
        parser.add_argument("--max-model-len", type=int, metavar="N")
        parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="F")
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
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def run(self, args: argparse.Namespace) -> int:
        fields: dict[str, Any] = {
            "model_config": _json_file("--model-config", args.model_config),
            "gpu": args.gpu,
            "tensor_parallel_size": args.tensor_parallel_size,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": args.max_model_len,
            "gpu_memory_utilization": args.gpu_memory_utilization,
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
        if args.draft_model_config:
            fields["draft_model_config"] = _json_file(
                "--draft-model-config", args.draft_model_config
            )
        result = preflight(request_from(fields))
        print(result.model_dump_json(indent=2) if args.json else render(result))
        return 0


def render(r: PreflightResult) -> str:
    """The result as a text table (figures formatted by memest.units)."""
    spec = f" + {r.speculative_method} K={r.num_speculative_tokens}" if r.speculative_method else ""
    lines = [
        f"{r.model} ({r.family}){spec} on {r.gpu}, TP {r.tensor_parallel_size}, per rank; "
        f"calibration {r.calibration}",
        f"grid: {r.max_num_seqs} seqs, {r.max_num_batched_tokens} batched tokens, "
        f"max_model_len {r.max_model_len}, utilization {r.gpu_memory_utilization}, "
        f"{r.total_graphs} CUDA graphs, {r.block_size}-token KV blocks ({r.attention_backend})",
        "",
        f"{'term':<42}{'GiB':>9}{'± GiB':>9}  law",
        f"{TERM_LABELS['requested_bytes']:<42}{fmt_gib(r.terms.requested_bytes):>9}",
    ]
    for t in r.term_details:
        label = TERM_LABELS.get(t.name, t.name)
        lines.append(f"{label:<42}{fmt_gib(t.bytes):>9}{fmt_gib(t.uncertainty_bytes):>9}  {t.law}")
    lines += [
        f"{'non-KV':<42}{fmt_gib(r.non_kv_bytes):>9}",
        "",
        f"KV cache per rank: {fmt_gib(r.kv_cache_bytes)} GiB ± "
        f"{fmt_gib(r.kv_cache_uncertainty_bytes)}: {r.kv_tokens:,} tokens "
        f"({r.kv_tokens_low:,} to {r.kv_tokens_high:,}), {r.kv_bytes_per_token:,} B per token"
        f"{' of the block pool' if r.kv_cache.groups else ''}, "
        f"max concurrency {concurrency_text(r.max_concurrency, r.max_model_len)}",
    ]
    lengths = Lengths(r.max_model_len, r.max_num_batched_tokens)
    groups = kv_groups_table(
        group_rows(r.kv_cache, r.kv_budget_bytes, lengths) if r.kv_cache.groups else [],
        r.max_model_len,
    )
    if groups is not None:
        lines += ["", *text_lines([groups])]
    if r.vllm_overshoot is not None:
        lines.append(overshoot_line(r.vllm_overshoot))
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


COMMAND = _Preflight()
