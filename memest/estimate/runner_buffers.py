"""vLLM 0.33.0's grid-sized persistent buffers (Model Runner V2), in bytes.

Buffers sized by ``max_num_seqs`` (S), ``max_num_batched_tokens`` (T), ``max_model_len`` (L),
the KV block size and the number of speculative tokens (K) are allocated while vLLM starts and
stay allocated: they move the full-initialization terms between two grids of one model.
Each buffer is charged to the term of the phase that allocates it:

======================================  ================================  ========================
buffer (vLLM 0.33.0 source)             bytes                              term (phase)
======================================  ================================  ========================
InputBuffers (gpu/input_batch.py)       T x (4+8+1) + (S+1)x4 + 2 S x4     baseline (init_device)
RequestState (gpu/states.py)            S x (4+4+8+4) + S x K x 8          baseline (init_device)
drafter hidden_states (target_depend-   T x drafter hidden x dtype         baseline (init_device)
ent_ar/speculator.py)
drafter InputBuffers and per-request    as InputBuffers, + S x (8+4+8+8+8) baseline (init_device)
tensors (spec_decode/speculator.py)     + S x K x (8+4)
penalties (gpu/sample/penalties.py)     S x V x 4 + S x ceil(V/32) x 4     weights (load_model)
structured outputs (gpu/structured_     S(K+1) x 4 + S(K+1) x ceil(V/32)x4 weights (load_model)
outputs.py)
top-k/top-p buffer (sample/ops/         min(next_pow2(min(SMs, S)), SMs)   profiling residue
topk_topp_triton.py)                    x V x 4                            (the sampler's dummy run)
block tables (gpu/block_table.py)       per KV-cache group g: 2 x S x      runner buffers
                                        width_g x 4; + groups x T x 8      (kv_cache_alloc)
                                        (slot mappings)
fused-MoE workspace (fused_moe/modular_ T x top_k x (max(N/2,K)+max(N,K))  profiling residue
kernel.py, v1/worker/workspace.py)      x dtype (memest.estimate.fused_moe) (the profile run)
DSA top-k indices (deepseek_v32/nvidia/ T x index_topk x 4                 weights (load_model)
model.py topk_indices_buffer)
======================================  ================================  ========================

Block tables are one per KV-cache group (model_runner.py: a staged-write table and the forward's
copy, each S x width int32): an attention group's width is ceil(L / its block) rounded up to a
128-token multiple (KVCacheSpec.block_table_token_alignment, get_block_table_width); a Mamba
group's is ceil(L / block) + K in ``align`` mode, else its 1 + K states
(MambaSpec.max_num_blocks_per_req). The tables' few per-group pointer, stride and flag tensors
hold one element per group, so one 512-B block each whatever the groups: left to the fitted rest.

V is the vocabulary, SMs the GPU's multiprocessor count (132 on an H200). Every size is rounded
up to 512 B, as PyTorch's caching allocator rounds each block. Model weights are not here: they
do not depend on the grid.

Real H200 starts (Llama-3-8B shape, reports/vllm/whatif_terms.txt) check these laws pair by pair.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memest.errors import ConfigError
from memest.estimate.fused_moe import fused_moe_workspace_bytes
from memest.estimate.indexer import topk_indices_bytes
from memest.estimate.model_shape import ModelShape, model_shape
from memest.schema import KVCacheGroup, KVCacheSpec, RunConfig, RunReport

#: PyTorch's caching allocator rounds every block up to this many bytes.
ALLOC_ROUND_BYTES = 512
#: Multiprocessors of an H100 / H200 (SXM), the top-k/top-p buffer's row cap.
H200_SMS = 132

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
}

#: The full-initialization term (memest.schema.FullInitTerms field) each buffer is charged to.
BUFFER_TERMS: dict[str, str] = {
    "input_buffers": "baseline_torch_bytes",
    "request_state": "baseline_torch_bytes",
    "drafter_hidden_states": "baseline_torch_bytes",
    "drafter_requests": "baseline_torch_bytes",
    "penalties": "weights_bytes",
    "structured_outputs": "weights_bytes",
    "topk_topp_buffer": "profiling_residue_bytes",
    "block_tables": "runner_buffer_bytes",
    "fused_moe_workspace": "profiling_residue_bytes",
    "dsa_topk_indices": "weights_bytes",
}

#: config.json keys that name routed experts (a MoE model: memest.estimate.model_shape).
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


@dataclass(frozen=True)
class ModelDims:
    """The model dimensions vLLM sizes its runner buffers by.

    ``drafter_hidden_size`` is the drafter's hidden size (EAGLE/MTP drafters); None means the
    target's. ``num_layers`` and ``drafter_layers`` are the decoder layers a captured graph of
    each holds (graph objects are charged by them); ``drafter_config`` is the drafter's
    ``config.json``, which sizes its weights (memest.estimate.drafter_weights); ``config`` the
    model's (its text part, with the dtype resolved), from which the what-if reads the model's shape
    (memest.estimate.model_shape) for the synthetic graph trace and the activation law.
    ``shape`` is the model's per-rank shape where the caller has it (the pre-flight); else the
    fused-MoE workspace reads ``config``'s.
    """

    hidden_size: int
    vocab_size: int
    dtype_bytes: int = 2
    drafter_hidden_size: int | None = None
    num_sms: int = H200_SMS
    num_layers: int | None = None
    drafter_layers: int | None = None
    drafter_config: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    config: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    shape: ModelShape | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "dtype_bytes", "num_sms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name}", value, "must be a positive integer")
        d = self.drafter_hidden_size
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d <= 0):
            raise ConfigError("model.drafter_hidden_size", d, "must be a positive integer")

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        *,
        drafter: Mapping[str, Any] | None = None,
        num_sms: int = H200_SMS,
    ) -> ModelDims:
        """From a Hugging Face ``config.json`` (and the drafter's, when there is one).

        Raises:
            ConfigError: ``hidden_size`` or ``vocab_size`` is missing, or the dtype is unknown.
        """
        text = config.get("text_config")
        cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
        for key in ("hidden_size", "vocab_size"):
            if key not in cfg:
                raise ConfigError(f"model config.{key}", None, "missing")
        dtype = _dtype_of(cfg) or _dtype_of(config) or "bfloat16"
        if dtype not in _DTYPE_BYTES:
            raise ConfigError("model config.torch_dtype", dtype, "not a known dtype")
        drafter_hidden = drafter_layers = None
        if drafter is not None:
            if "hidden_size" not in drafter:
                raise ConfigError("drafter config.hidden_size", None, "missing")
            drafter_hidden = drafter["hidden_size"]
            drafter_layers = _layers(drafter, "drafter config")
        return cls(
            hidden_size=cfg["hidden_size"],
            vocab_size=cfg["vocab_size"],
            dtype_bytes=_DTYPE_BYTES[dtype],
            drafter_hidden_size=drafter_hidden,
            num_sms=num_sms,
            num_layers=_layers(cfg, "model config"),
            drafter_layers=drafter_layers,
            drafter_config=dict(drafter) if drafter is not None else None,
            config={**cfg, "torch_dtype": dtype},
        )

    def drafter_weight_bytes(self, method: str | None) -> int | None:
        """Weights the drafter adds under ``method`` (None: no drafter config, or not modelled)."""
        from memest.estimate.drafter_weights import drafter_weight_bytes

        if self.drafter_config is None or method not in ("eagle", "eagle3"):
            return None
        target = {"vocab_size": self.vocab_size}
        return drafter_weight_bytes(self.drafter_config, target, method, self.dtype_bytes)

    @classmethod
    def from_report(
        cls,
        report: RunReport,
        config: Mapping[str, Any] | None = None,
        *,
        drafter: Mapping[str, Any] | None = None,
    ) -> ModelDims | None:
        """From a start's report and, where given, its model's (and drafter's) ``config.json``.

        The report gives the GPU (its multiprocessor count) and, when the plugin recorded them,
        the model's and the drafter's dimensions (``config.model_dims`` / ``drafter_dims``); a
        given ``config`` or ``drafter`` overrides the recorded one. None when neither the report
        nor the caller gives the model's dimensions.

        Raises:
            ConfigError: a drafter without the model, or a config that lacks a dimension.
        """
        recorded, recorded_drafter = report.config.model_dims, report.config.drafter_dims
        if config is None and recorded is not None:
            config = recorded.model_dump(exclude_none=True)
        if drafter is None and recorded_drafter is not None:
            drafter = recorded_drafter.model_dump(exclude_none=True)
        if config is None:
            if drafter is not None:
                raise ConfigError("drafter config", "...", "needs the model's config too")
            return None
        return cls.from_hf_config(config, drafter=drafter, num_sms=sms_of(report))


def _dtype_of(config: Mapping[str, Any]) -> str | None:
    """The config's dtype (``torch_dtype``, or ``dtype`` in newer configs), without ``torch.``."""
    value = config.get("torch_dtype") or config.get("dtype")
    return None if value is None else str(value).removeprefix("torch.")


def _layers(config: Mapping[str, Any], name: str) -> int | None:
    value = config.get("num_hidden_layers")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name}.num_hidden_layers", value, "must be an integer >= 0")
    return value


def sms_of(report: RunReport) -> int:
    """Multiprocessor count of the report's GPU (vLLM 0.33.0's targets; H200 otherwise)."""
    name = report.gpu.name if report.gpu is not None else ""
    if "B200" in name or "GB200" in name:
        return 148
    return H200_SMS


#: KVCacheSpec.block_table_token_alignment of attention specs (vLLM 0.33.0; Mamba's: none).
BLOCK_TABLE_TOKEN_ALIGNMENT = 128


@dataclass(frozen=True, slots=True)
class GroupTable:
    """One KV-cache group's block table: its block size and, for a Mamba (state) group, whether it
    runs in ``align`` mode (prefix caching) and its speculative blocks."""

    block_size: int
    state: bool = False
    align: bool = True
    spec_tokens: int = 0

    @classmethod
    def from_group(cls, group: KVCacheGroup, spec_tokens: int = 0) -> GroupTable:
        """From a recorded or predicted group: a Mamba group holds 1 + K states per request
        outside ``align`` mode and more within it (linear_attention.state_blocks), which tells the
        mode apart."""
        if group.kind != "mamba":
            return cls(group.block_size)
        held = group.state_blocks or 1 + spec_tokens
        return cls(group.block_size, True, held > 1 + spec_tokens, spec_tokens)

    def width(self, max_model_len: int) -> int:
        """Entries of one request's row (max_num_blocks_per_req, then get_block_table_width)."""
        blocks = math.ceil(max_model_len / self.block_size)
        if self.state:
            return blocks + self.spec_tokens if self.align else 1 + self.spec_tokens
        step = BLOCK_TABLE_TOKEN_ALIGNMENT // math.gcd(BLOCK_TABLE_TOKEN_ALIGNMENT, self.block_size)
        return math.ceil(blocks / step) * step


def group_tables(spec: KVCacheSpec | None, spec_tokens: int = 0) -> tuple[GroupTable, ...]:
    """The block tables of a KV spec's groups (empty: one group, the grid's block size)."""
    if spec is None:
        return ()
    return tuple(GroupTable.from_group(g, spec_tokens) for g in spec.groups)


@dataclass(frozen=True)
class RunnerGrid:
    """The scheduler and speculative settings the runner buffers are sized by."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int = 16
    num_speculative_tokens: int = 0
    speculative_method: str | None = None
    tensor_parallel_size: int = 1
    #: the KV-cache groups' block tables (empty: one group of ``block_size``-token blocks)
    tables: tuple[GroupTable, ...] = ()

    @property
    def block_tables(self) -> tuple[GroupTable, ...]:
        return self.tables or (GroupTable(self.block_size),)

    @classmethod
    def from_config(cls, config: RunConfig, *, block_size: int = 16) -> RunnerGrid:
        """From a start's configuration (a report's, or a what-if's G').

        Raises:
            ConfigError: a scheduler limit the buffers are sized by is unknown.
        """
        seqs, tokens, length = (
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_model_len,
        )
        if seqs is None or tokens is None or length is None:
            missing = "max_num_seqs" if seqs is None else "max_num_batched_tokens"
            missing = "max_model_len" if seqs and tokens else missing
            raise ConfigError(f"config.{missing}", None, "unknown, so runner buffers are too")
        return cls(
            max_num_seqs=seqs,
            max_num_batched_tokens=tokens,
            max_model_len=length,
            block_size=block_size,
            num_speculative_tokens=config.num_speculative_tokens
            if config.speculative_method
            else 0,
            speculative_method=config.speculative_method,
            tensor_parallel_size=config.tensor_parallel_size,
        )

    @classmethod
    def from_report(cls, report: RunReport) -> RunnerGrid:
        block = report.kv_cache.block_size if report.kv_cache is not None else 16
        grid = cls.from_config(report.config, block_size=block)
        tables = group_tables(report.kv_cache, grid.num_speculative_tokens)
        return dataclasses.replace(grid, tables=tables) if tables else grid


def _blocks(*sizes: int) -> int:
    """Bytes the caching allocator hands out for tensors of these sizes (512-B rounding)."""
    return sum(math.ceil(n / ALLOC_ROUND_BYTES) * ALLOC_ROUND_BYTES for n in sizes if n > 0)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _input_buffers(seqs: int, tokens: int) -> int:
    # input_ids int32, positions int64, is_padding bool; query_start_loc, seq_lens,
    # dcp_local_seq_lens int32.
    return _blocks(tokens * 4, tokens * 8, tokens, (seqs + 1) * 4, seqs * 4, seqs * 4)


def _drafter(dims: ModelDims, grid: RunnerGrid) -> dict[str, int]:
    if not grid.speculative_method or grid.num_speculative_tokens <= 0:
        return {}
    s, t, k = grid.max_num_seqs, grid.max_num_batched_tokens, grid.num_speculative_tokens
    hidden = dims.drafter_hidden_size or dims.hidden_size
    requests = _input_buffers(s, t) + _blocks(
        s * 8,  # idx_mapping
        s * 4,  # temperature
        s * 8,  # seeds
        s * k * 8,  # draft_tokens
        s * k * 4,  # draft_token_confidence_probs
        8,  # current_draft_step
        s * 8,  # last_token_indices
        s * 8,  # sample_src_positions
    )
    return {
        "drafter_hidden_states": _blocks(t * hidden * dims.dtype_bytes),
        "drafter_requests": requests,
    }


def _moe_shape(dims: ModelDims, grid: RunnerGrid) -> ModelShape | None:
    """The per-rank shape of a MoE model (None: not MoE, or no config to tell)."""
    if dims.shape is not None:
        return dims.shape if dims.shape.moe_layers else None
    cfg = dims.config
    if cfg is None or not any(cfg.get(k) for k in _EXPERT_KEYS):
        return None
    return model_shape(cfg, tp=grid.tensor_parallel_size)


def runner_buffer_bytes(dims: ModelDims, grid: RunnerGrid) -> dict[str, int]:
    """Bytes of each grid-sized persistent buffer of vLLM 0.33.0 (names: ``BUFFER_TERMS``)."""
    s, t, v = grid.max_num_seqs, grid.max_num_batched_tokens, dims.vocab_size
    k = grid.num_speculative_tokens if grid.speculative_method else 0
    words = math.ceil(v / 32)  # one int32 bit-mask word per 32 tokens of vocabulary
    logits_rows = s * (k + 1)
    topk_rows = min(_next_pow2(min(dims.num_sms, s)), dims.num_sms)
    tables = grid.block_tables
    out = {
        "input_buffers": _input_buffers(s, t),
        "request_state": _blocks(s * 4, s * 4, s * 8, s * k * 8, s * 4),
        **_drafter(dims, grid),
        "penalties": _blocks(s * v * 4, s * words * 4),
        "structured_outputs": _blocks(logits_rows * 4, logits_rows * words * 4),
        "topk_topp_buffer": _blocks(topk_rows * v * 4),
        "block_tables": _block_tables(tables, s, t, grid.max_model_len),
    }
    moe = _moe_shape(dims, grid)
    if moe is not None:  # the profile run's forward of T tokens sizes it (the widest)
        out["fused_moe_workspace"] = fused_moe_workspace_bytes(moe, t)
    topk = _index_topk(dims)
    if topk:
        out["dsa_topk_indices"] = _blocks(topk_indices_bytes(t, topk))
    return out


def _block_tables(tables: tuple[GroupTable, ...], seqs: int, tokens: int, length: int) -> int:
    """Per group a staged-write table and the forward's copy (int32); one int64 slot mapping per
    group and token (BlockTables.slot_mappings, one tensor)."""
    rows = [seqs * g.width(length) * 4 for g in tables]
    return _blocks(*rows, *rows, len(tables) * tokens * 8)


def _index_topk(dims: ModelDims) -> int:
    """A DSA model's index_topk (0: no indexer, or no shape or config to tell)."""
    if dims.shape is not None:
        return dims.shape.index_topk
    cfg = dims.config or {}
    topk = cfg.get("index_topk")
    return topk if isinstance(topk, int) and cfg.get("kv_lora_rank") else 0


def term_bytes(dims: ModelDims, grid: RunnerGrid) -> dict[str, int]:
    """The buffers summed per full-initialization term they are charged to."""
    out: dict[str, int] = {}
    for name, size in runner_buffer_bytes(dims, grid).items():
        term = BUFFER_TERMS[name]
        out[term] = out.get(term, 0) + size
    return out


def total_bytes(dims: ModelDims, grid: RunnerGrid) -> int:
    """Every grid-sized persistent buffer of one start (for a pre-flight's absolute figure)."""
    return sum(runner_buffer_bytes(dims, grid).values())
