"""Owner rules: which stack frame makes an allocation belong to which owner.

Rules are data. Each rule names an owner and glob patterns for a frame's function name and/or
file name. Frames are scanned innermost first; at each frame the rules are tried in order, and
the first match names the owner. When nothing matches, the owner is
``unattributed:<function> (<file>)`` of the top frame: the innermost frame outside the skipped
files (torch internals, memest's own hooks, contextlib), so unattributed bytes stay visible.

Under torch.compile the allocating frame is Inductor's generated code. When the start recorded a
map of that code (memest.analysis.inductor, ``RunReport.compiled_code``), a frame in a generated
file is one more rule source: its allocation site's FX source nodes are tried from the buffer's
producer backwards, first against the rules that name a ``module`` (glob on the node's module
path, e.g. ``*.self_attn.qkv_proj``) or ``code`` (glob on the source text of the node's stack
frame), then against the frame rules on the node's own stack frame. A compiled allocation that no
rule names is ``compiled_piece:<why>`` (no source node recorded, no module map recorded, no rule
for ``layers.*.foo``); without any map it stays ``compiled_piece``.

User rules come from a JSON file::

    {"rules": [{"owner": "my_buffer", "function": "alloc_*", "file": "*/mypkg/*.py"},
               {"owner": "my_proj", "module": "*.my_proj"},
               {"owner": "my_gemm", "function": "gemm_helper", "defer": true}],
     "skip_files": ["*/mypkg/allocator_shim.py"]}
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import translate
from pathlib import Path
from typing import Any

from memest.analysis.inductor import (
    CompiledIndex,
    generated_key,
    site_descriptor,
    site_nodes,
    unnamed_reason,
)
from memest.errors import ConfigError
from memest.schema.report import CompiledCode, CompiledFile, CompiledNode, CompiledSite

UNATTRIBUTED = "unattributed"
NO_STACK = "<no stack>"
COMPILED_PIECE = "compiled_piece"
#: torch's cuBLAS workspace, allocated inside a GEMM call once per (handle, stream) and kept.
CUBLAS_WORKSPACE = "cublas_workspace"


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """One pattern → owner rule (glob patterns; an omitted pattern matches anything).

    ``module`` and ``code`` match compiled code's FX source nodes only (module path, source
    text of the node's stack frame); ``function`` and ``file`` match stack frames, the nodes'
    own included. ``site`` matches what the generated code's structure says of an allocation no
    source node names (memest.analysis.inductor.site_descriptor: ``call <op>``, ``unwritten``,
    ``input of <module>``); a rule with ``site`` matches nothing else. ``line`` narrows a frame
    rule to one line of its file (two allocations of one function with different owners).
    """

    owner: str
    function: str | None = None
    file: str | None = None
    module: str | None = None
    code: str | None = None
    site: str | None = None
    line: int | None = None
    defer: bool = False

    @property
    def compiled_only(self) -> bool:
        return self.module is not None or self.code is not None or self.site is not None


#: The DSA indexer's logits: the MQA-logits kernel's output as the frame rules name it (BF16, as
#: DeepGEMM writes it on SM100), vLLM's FP32 copy (as_fp32_logits), and the kernel's output when
#: it is already FP32 (DeepGEMM on SM90, where as_fp32_logits returns it unchanged).
INDEXER_LOGITS_BF16 = "indexer_logits_bf16"
INDEXER_LOGITS_FP32_COPY = "indexer_logits_fp32"
INDEXER_LOGITS_FP32_KERNEL = "indexer_logits_fp32_kernel"
#: The DSA indexer's FP8 query and per-head weights (fused_q), and the top-k indices it selects.
INDEXER_Q = "indexer_q"
INDEXER_TOPK = "indexer_topk"


def indexer_kernel_output_is_fp32(
    stage_owners: Iterable[str], compute_capability: str | None
) -> bool:
    """Whether the indexer kernel's output in one captured stage is FP32 rather than BF16.

    A stage holding vLLM's FP32 copy converted a BF16 output. Without a copy the GPU decides:
    DeepGEMM's SM90 (major 9) kernels write FP32, which vLLM's top-k reads as is; on SM100 a
    BF16 output without a copy is DeepSelect's top-k reading BF16. Unknown GPU: BF16, as named.
    """
    if INDEXER_LOGITS_FP32_COPY in set(stage_owners):
        return False
    return (compute_capability or "").split(".")[0] == "9"


# vLLM 0.33.0 (shared hook map, section 4). Order matters within one frame only.
_VLLM_0_33_RULES: tuple[OwnerRule, ...] = (
    OwnerRule(INDEXER_LOGITS_FP32_COPY, "as_fp32_logits"),
    OwnerRule(INDEXER_LOGITS_BF16, "fp8_fp4_paged_mqa_logits"),
    OwnerRule(INDEXER_LOGITS_BF16, "fp8_fp4_mqa_logits"),
    OwnerRule(INDEXER_LOGITS_BF16, "_decode_rows", "*sparse*indexer*"),
    OwnerRule(INDEXER_LOGITS_BF16, "_decode_rows", "*/specialized_decode/*"),
    OwnerRule(INDEXER_LOGITS_BF16, "*", "*/sparse_indexer_scores.py"),
    OwnerRule(INDEXER_LOGITS_BF16, "*", "*/qsa_indexer.py"),
    # CudaGraphManager.store_capture_output: the hidden-states buffer FULL graphs write (line
    # 653), then EAGLE3's aux hidden-state buffers (line 657)
    OwnerRule(
        "graph_output", "store_capture_output", "*/v1/worker/gpu/cudagraph_utils.py", line=653
    ),
    # torch's CUDAGraph.capture_begin: the capture's generator state (seed / offset, 8 B each)
    OwnerRule("graph_capture_state", "capture_begin", "*torch/cuda/graphs.py"),
    OwnerRule("aux_hidden_states", "_maybe_add_hidden_state"),
    OwnerRule("aux_hidden_states", "_store_hidden_states", "*spec_decode/*"),
    OwnerRule("aux_hidden_states", "store_capture_output"),
    # DSpark (v1/worker/gpu/spec_decode/dspark/speculator.py, models/qwen3_dspark.py): the
    # drafter's lm_head over all K positions at once (compute_draft_logits: rows x K x draft
    # vocabulary), then per draft step the previous token's Markov embedding (rows x rank), the
    # Markov bias (markov_w2: rows x draft vocabulary; the top-k variant corrects in place) and
    # the step's logits, base[:, i] + bias (line 193); the gathered head hidden states the
    # lm_head reads (lines 173 / 222: rows x K x hidden); the rest of _sample_sequential is the
    # anchor and sampled ids and the sampler's scratch (bytes per request)
    OwnerRule("draft_logits", "compute_draft_logits"),
    OwnerRule("draft_logits.markov_bias", "markov_bias", "*/models/qwen3_dspark.py"),
    OwnerRule("draft_logits.markov_bias", "apply_markov_bias_gathered"),
    OwnerRule("draft_markov_embed", "markov_embed", "*/models/qwen3_dspark.py"),
    OwnerRule("draft_logits.step", "_sample_sequential", "*spec_decode/dspark/*", line=193),
    OwnerRule("draft_sample_hidden", "_sample_sequential*", "*spec_decode/dspark/*", line=173),
    OwnerRule("draft_sample_hidden", "_sample_sequential*", "*spec_decode/dspark/*", line=222),
    OwnerRule("draft_sampler", "_sample_sequential*", "*spec_decode/dspark/*"),
    # DFlash / DSpark: the context K/V the drafter projects from the target's hidden states,
    # normalises and ropes before writing it to its KV cache (models/qwen3_dflash.py)
    OwnerRule("draft_context_kv", "precompute_and_store_context_kv", "*/models/qwen3_dflash.py"),
    OwnerRule("draft_context_kv", "_project_context_kv", "*/models/qwen3_dflash.py"),
    OwnerRule("draft_context_kv", "_normalize_context_k", "*/models/qwen3_dflash.py"),
    OwnerRule("draft_logits", "sample_draft", "*spec_decode/*"),
    OwnerRule("attn_output", "_alloc_attn_out"),
    # The MLP's activation (SiluAndMul and the others): its output. Under torch.compile this is
    # the rule an activation node reaches through its frame when its map has no module path
    # (a map rebuilt from vLLM's compile cache: the node reads no parameter).
    OwnerRule("mlp_act", "*", "*/model_executor/layers/activation.py"),
    OwnerRule("qnorm_rope_kv_insert", "_fused_qnorm_rope_kv_insert"),
    # MLA (mla_attention.py, the MLA backends): the chunked-prefill workspace the metadata
    # builder keeps (and the profile pass's stand-in for kv_b_proj's output over it, line 939),
    # the prefill's k and attention, the decode's latent q and its output / LSE
    OwnerRule("mla_prefill_workspace", "__init__", "*/layers/attention/mla_attention.py"),
    OwnerRule(
        "mla_prefill_workspace", "forward_impl", "*/layers/attention/mla_attention.py", line=939
    ),
    OwnerRule("mla_prefill", "_concat_k_nope_k_pe", "*/layers/attention/mla_attention.py"),
    OwnerRule("mla_prefill", "forward_mha", "*/layers/attention/mla_attention.py"),
    OwnerRule("mla_prefill", "*", "*/attention/backends/mla/prefill/*"),
    OwnerRule("mla_decode", "forward_impl", "*/layers/attention/mla_attention.py"),
    OwnerRule("mla_decode", "forward_mqa", "*/attention/backends/mla/*"),
    # DeepSeek-V3.2 (DSA, models/deepseek_v32): DeepseekV32Attention.forward's output buffer
    # (line 318), the normed latent kv and roped k_pe the fused norm/rope kernel writes (373,
    # 374), the absorbed latent query q_nope . W_UK^T the sparse MQA attend reads (424), the
    # dense-MHA prefill's query cat(q_nope, q_pe) (566); the fused kernels' outputs: the normed q
    # latent (fused_norm_rope), the indexer's FP8 query and its per-head weights (fused_q, 1052 /
    # 1053) and the MQA query's roped q_pe (fused_q); the top-k over the indexer's logits (the
    # CUDA ops write vLLM's persistent top-k index buffer; the lab's stand-ins make the indices
    # in temporaries); the fused q/kv A-projection (deepseek_v2.py); the first layer's fused
    # embedding gather (line 131) and its input RMSNorm (132)
    OwnerRule("attn_output", "forward", "*/models/deepseek_v32/attention.py", line=318),
    OwnerRule("qk_norm_rope", "forward", "*/models/deepseek_v32/attention.py", line=373),
    OwnerRule("qk_norm_rope", "forward", "*/models/deepseek_v32/attention.py", line=374),
    OwnerRule("mla_decode", "forward", "*/models/deepseek_v32/attention.py", line=424),
    OwnerRule(
        "mla_prefill", "_sparse_indexer_and_attn", "*/models/deepseek_v32/attention.py", line=566
    ),
    OwnerRule("qk_norm_rope", "fused_norm_rope", "*/deepseek_v32/common/kernels.py"),
    OwnerRule(INDEXER_Q, "fused_q", "*/deepseek_v32/common/kernels.py", line=1052),
    OwnerRule(INDEXER_Q, "fused_q", "*/deepseek_v32/common/kernels.py", line=1053),
    OwnerRule("mla_decode", "fused_q", "*/deepseek_v32/common/kernels.py"),
    OwnerRule(INDEXER_TOPK, "top_k_per_row_*"),
    OwnerRule("qkv_proj", "_min_latency_fused_qkv_a_proj_impl", "*/models/deepseek_v2.py"),
    OwnerRule("embedding", "fused_embed_norm", "*/layers/fused_embed_norm.py", line=131),
    OwnerRule("norm", "fused_embed_norm", "*/layers/fused_embed_norm.py", line=132),
    OwnerRule("moe_workspace", "_allocate_buffers", "*fused_moe/*"),
    OwnerRule("moe_workspace", "*", "*/fused_moe/*"),
    # An eager linear layer's F.linear (layers/utils.py): its output is the caller's (the
    # drafter's lm_head is draft_logits); a GEMM workspace when no caller is named
    OwnerRule("gemm_workspace", "default_unquantized_gemm", "*/layers/utils.py", defer=True),
    OwnerRule("gemm_workspace", "*gemm*", "*vllm/*"),
    OwnerRule("gemm_workspace", "*", "*/layers/quantization/*"),
    OwnerRule("gemm_workspace", "*_get_*workspace_buffer", "*vllm/v1/attention/*"),
    OwnerRule("kv_cache", "allocate_kv_cache"),
    OwnerRule("kv_cache", "_allocate_kv_cache_tensors"),
    OwnerRule("kv_cache", "initialize_kv_cache_tensors"),
    OwnerRule("weights", "load_weights"),
    OwnerRule("weights", "*", "*/model_loader/*"),
    OwnerRule("weights", "process_weights_after_loading"),
    OwnerRule("sampler", "*", "*/v1/worker/gpu/sample/*"),
    OwnerRule("sampler", "*", "*/v1/sample/*"),
)

# Compiled code (torch.compile / VLLM_COMPILE): module paths of vLLM 0.33.0's decoder models
# (Llama, Qwen, Mixtral, DeepSeek, EAGLE3 drafters). Tried per FX node before the frame rules.
_VLLM_0_33_COMPILED_RULES: tuple[OwnerRule, ...] = (
    OwnerRule("aux_hidden_states", code="*aux_hidden_states*"),
    OwnerRule("attn_output", code="*scaled_dot_product_attention(*"),
    OwnerRule("attn_output", module="*.attn"),
    OwnerRule("attn_output", module="*.attn.*"),
    OwnerRule("attn_output", module="*.mla_attn*"),
    OwnerRule("qk_norm_rope", module="*.q_norm"),
    OwnerRule("qk_norm_rope", module="*.k_norm"),
    OwnerRule("qk_norm_rope", module="*rotary_emb*"),
    OwnerRule("qkv_proj", module="*.qkv_proj"),
    OwnerRule("qkv_proj", module="*.[qkv]_proj"),
    OwnerRule("qkv_proj", module="*.q_a_proj"),
    OwnerRule("qkv_proj", module="*.q_b_proj"),
    OwnerRule("qkv_proj", module="*.kv_a_proj_with_mqa"),
    OwnerRule("qkv_proj", module="*.kv_b_proj"),
    OwnerRule("qkv_proj", module="*.fused_qkv_a_proj"),
    OwnerRule("qk_norm_rope", module="*.q_a_layernorm"),
    OwnerRule("qk_norm_rope", module="*.kv_a_layernorm"),
    OwnerRule("o_proj", module="*.o_proj"),
    OwnerRule("moe_router_logits", module="*.mlp.gate"),
    OwnerRule("moe_workspace", module="*.experts"),
    OwnerRule("moe_workspace", module="*.experts.*"),
    OwnerRule("mlp_gate_up", module="*.gate_up_proj"),
    OwnerRule("mlp_gate_up", module="*.gate_proj"),
    OwnerRule("mlp_gate_up", module="*.up_proj"),
    OwnerRule("mlp_act", module="*.act_fn"),
    OwnerRule("mlp_down", module="*.down_proj"),
    OwnerRule("eagle3_fc", module="fc"),
    OwnerRule("eagle3_fc", module="*.fc"),
    OwnerRule("norm", module="*layernorm"),
    OwnerRule("norm", module="norm"),
    OwnerRule("norm", module="*.norm"),
    OwnerRule("norm", module="*_norm"),
    OwnerRule("embedding", module="*embed_tokens"),
    OwnerRule("logits", module="*lm_head"),
    OwnerRule("logits", module="*logits_processor*"),
    OwnerRule("residual", module="*layers.[0-9]"),
    OwnerRule("residual", module="*layers.[0-9][0-9]"),
    OwnerRule("residual", module="*layers.[0-9][0-9][0-9]"),
    # What the generated code's structure says when no source node names an allocation.
    # torch's cuBLAS workspace: allocated on a stream's first GEMM (one per capture stream,
    # kept for the stream's life; torch.backends.cuda.cublas_workspace_size).
    OwnerRule(CUBLAS_WORKSPACE, site="call extern_kernels.*mm"),
    # vLLM splits the graph at its attention ops (CompilationConfig._attention_ops), whose output
    # the piece before allocates (Attention.forward's torch.empty) and does not write.
    OwnerRule("attn_output", site="unwritten"),
    # EAGLE3's first drafter layer: [norm(embeds), norm(hidden)] concatenated by a kernel whose
    # comment lists no source node, read by qkv_proj.
    OwnerRule("qkv_input", site="input of *.qkv_proj"),
)

_DEFAULT_SKIP_FILES: tuple[str, ...] = (
    "torch/*",
    "*/torch/*",
    "*memest_instrumentation/*",
    "*/contextlib.py",
    "contextlib.py",
    "*/threading.py",
    "*/functools.py",
    "<*",
)


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None or pattern == "*":
        return None
    return re.compile(translate(pattern))


_Compiled = tuple[str, re.Pattern[str] | None, re.Pattern[str] | None, int | None, bool]
#: A frame's verdict: (owner or None, file skipped when naming the top frame, owner deferred).
Verdict = tuple[str | None, bool, bool]


@dataclass
class OwnerRules:
    """An ordered list of owner rules plus the files skipped when naming the top frame.

    ``compiled`` is the map of this start's generated code (empty: none recorded).
    """

    rules: list[OwnerRule] = field(default_factory=list)
    skip_files: list[str] = field(default_factory=lambda: list(_DEFAULT_SKIP_FILES))
    compiled: CompiledIndex = field(default_factory=lambda: CompiledIndex(None))
    _compiled: list[_Compiled] = field(default_factory=list, init=False, repr=False)
    _node_rules: list[tuple[str, OwnerRule, list[re.Pattern[str] | None]]] = field(
        default_factory=list, init=False, repr=False
    )
    _site_rules: list[tuple[str, re.Pattern[str] | None]] = field(
        default_factory=list, init=False, repr=False
    )
    _skip: re.Pattern[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._recompile()

    def _recompile(self) -> None:
        self._compiled = [
            (r.owner, _compile(r.function), _compile(r.file), r.line, r.defer)
            for r in self.rules
            if not r.compiled_only
        ]
        # Node rules: module/code rules first (in order), then the frame rules.
        ordered = [r for r in self.rules if r.compiled_only and r.site is None] + [
            r for r in self.rules if not r.compiled_only
        ]
        self._site_rules = [(r.owner, _compile(r.site)) for r in self.rules if r.site is not None]
        self._node_rules = [
            (r.owner, r, [_compile(p) for p in (r.module, r.code, r.function, r.file)])
            for r in ordered
        ]
        self._skip = (
            re.compile("|".join(f"(?:{translate(p)})" for p in self.skip_files))
            if self.skip_files
            else None
        )

    @classmethod
    def default(cls) -> OwnerRules:
        """Rules for vLLM 0.33.0's owners (indexer logits, aux hidden states, draft logits, ...)."""
        return cls(rules=[*_VLLM_0_33_RULES, *_VLLM_0_33_COMPILED_RULES])

    def with_compiled(self, code: CompiledCode | None) -> OwnerRules:
        """These rules with a map of generated code (a report's or a snapshot's)."""
        return OwnerRules(
            rules=list(self.rules), skip_files=list(self.skip_files), compiled=CompiledIndex(code)
        )

    @classmethod
    def from_data(cls, data: object, *, source: str = "rules") -> OwnerRules:
        """Rules from a parsed JSON object (see the module docstring).

        Raises:
            ConfigError: a rule lacks an owner, has no pattern, or has a non-string pattern.
        """
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise ConfigError(
                source,
                data if not isinstance(data, dict) else "...",
                'expected {"rules": [{"owner": ..., "function": ..., "file": ...}]}',
            )
        rules = [_rule_from(item, f"{source}.rules[{i}]") for i, item in enumerate(data["rules"])]
        skip = data.get("skip_files", [])
        if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
            raise ConfigError(f"{source}.skip_files", skip, "expected a list of glob strings")
        return cls(rules=rules, skip_files=[*_DEFAULT_SKIP_FILES, *skip])

    @classmethod
    def from_file(cls, path: str | Path, *, with_defaults: bool = True) -> OwnerRules:
        """Rules from a JSON file; by default they take priority over the vLLM defaults.

        Raises:
            ConfigError: the file is not valid JSON or a rule is malformed.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(str(p), f"line {exc.lineno}", "invalid JSON") from None
        user = cls.from_data(data, source=str(p))
        return cls.default().extend(user) if with_defaults else user

    def extend(self, other: OwnerRules | Iterable[OwnerRule]) -> OwnerRules:
        """A new rule set: ``other``'s rules first (they win at the same frame), then these."""
        if isinstance(other, OwnerRules):
            rules, skip = list(other.rules), list(other.skip_files)
        else:
            rules, skip = list(other), []
        merged_skip = list(dict.fromkeys([*self.skip_files, *skip]))
        return OwnerRules(
            rules=[*rules, *self.rules], skip_files=merged_skip, compiled=self.compiled
        )

    def to_data(self) -> dict[str, Any]:
        return {
            "rules": [
                {k: v for k, v in zip(_RULE_KEYS, _rule_values(r), strict=True) if v is not None}
                for r in self.rules
            ],
            "skip_files": list(self.skip_files),
        }

    def skipped(self, filename: str) -> bool:
        return bool(self._skip and self._skip.match(filename))

    def match_frame(self, frame: Sequence[Any]) -> str | None:
        """Owner named by one frame, or None."""
        return self._match_frame(frame)[0]

    def _match_frame(self, frame: Sequence[Any]) -> tuple[str | None, bool]:
        """(owner named by one frame or None, whether the matching rule defers)."""
        filename, name = str(frame[0]), str(frame[2])
        for owner, fpat, filepat, line, defer in self._compiled:
            if (
                (fpat is None or fpat.match(name))
                and (filepat is None or filepat.match(filename))
                and (line is None or line == _line(frame))
            ):
                return owner, defer
        return None, False

    def match_site(self, file: CompiledFile, site: CompiledSite | None, line: int = -1) -> str:
        """Owner of an allocation in generated code (at ``line``, an allocation site or not);
        ``compiled_piece:<why>`` if none: source nodes first, then the site's structure."""
        if site is not None:
            nodes = [n for _, n in site_nodes(file, site) if n is not None]
            for compiled_first in (True, False):
                for node in nodes:
                    owner = self._match_node_pass(node, compiled_first)
                    if owner is not None:
                        return owner
        described = site_descriptor(file, site, line)
        if described is not None:
            for owner, pat in self._site_rules:
                if pat is None or pat.match(described):
                    return owner
        return f"{COMPILED_PIECE}:{unnamed_reason(file, site, line)}"

    def _match_node_pass(self, node: CompiledNode, compiled_first: bool) -> str | None:
        values = (node.module, node.code, node.function, node.file)
        for owner, rule, pats in self._node_rules:
            if rule.compiled_only != compiled_first:
                continue
            if all(
                p is None or (v is not None and p.match(v))
                for p, v in zip(pats, values, strict=True)
            ):
                return owner
        return None

    def _frame_verdict(self, frame: Sequence[Any]) -> Verdict:
        """(owner, skipped, deferred) of one frame; a frame in mapped generated code is a
        compiled site."""
        filename = str(frame[0])
        if self.compiled:
            found = self.compiled.site(filename, _line(frame))
            if found is not None:
                site_owner = self.match_site(*found, _line(frame))
                if not site_owner.startswith(COMPILED_PIECE):
                    return site_owner, False, False
        owner, deferred = self._match_frame(frame)
        return owner, self.skipped(filename), deferred

    def classify(self, frames: Sequence[Sequence[Any]]) -> tuple[str, str]:
        """Owner and top frame of a stack (frames ``[filename, line, name]``, innermost first)."""
        return self.classify_indexed(frames, range(len(frames)), {})

    def classify_indexed(
        self,
        frames: Sequence[Sequence[Any]],
        stack: Sequence[int],
        cache: dict[int, Verdict],
    ) -> tuple[str, str]:
        """classify() for a stack of indices into ``frames``, memoising each frame's verdict."""
        top = None
        fallback: tuple[str, str] | None = None
        for idx in stack:
            verdict = cache.get(idx)
            if verdict is None:
                verdict = self._frame_verdict(frames[idx])
                cache[idx] = verdict
            owner, skipped, deferred = verdict
            if owner is not None and not deferred:
                return owner, _fmt_frame(frames[idx])
            if owner is not None and fallback is None:
                fallback = owner, _fmt_frame(frames[idx])
            if top is None and not skipped:
                top = frames[idx]
        if fallback is not None:
            return fallback
        if top is None:
            if not stack:
                return f"{UNATTRIBUTED}:{NO_STACK}", NO_STACK
            top = frames[stack[0]]
        if generated_key(str(top[0])) is not None:
            return self._unnamed_compiled(top), _fmt_frame(top)
        return f"{UNATTRIBUTED}:{top[2]} ({top[0]})", _fmt_frame(top)

    def _unnamed_compiled(self, top: Sequence[Any]) -> str:
        """``compiled_piece`` (no map of this code) or ``compiled_piece:<why>``."""
        found = self.compiled.site(str(top[0]), _line(top)) if self.compiled else None
        if found is None:
            return COMPILED_PIECE
        return self.match_site(*found, _line(top))


_RULE_KEYS = ("owner", "function", "file", "module", "code", "site", "line", "defer")
_GLOB_KEYS = ("function", "file", "module", "code", "site")


def _rule_values(r: OwnerRule) -> tuple[str | int | bool | None, ...]:
    # defer is written only when set, as the other keys only when given
    return (r.owner, r.function, r.file, r.module, r.code, r.site, r.line, r.defer or None)


def _rule_from(item: object, where: str) -> OwnerRule:
    if not isinstance(item, dict):
        raise ConfigError(where, item, "expected an object")
    unknown = set(item) - set(_RULE_KEYS)
    if unknown:
        raise ConfigError(where, sorted(unknown), f"unknown keys ({', '.join(_RULE_KEYS)})")
    owner = item.get("owner")
    if not isinstance(owner, str) or not owner:
        raise ConfigError(f"{where}.owner", owner, "expected a non-empty string")
    line = item.get("line")
    if line is not None and (isinstance(line, bool) or not isinstance(line, int) or line < 1):
        raise ConfigError(f"{where}.line", line, "expected a line number (an integer >= 1)")
    defer = item.get("defer", False)
    if not isinstance(defer, bool):
        raise ConfigError(f"{where}.defer", defer, "expected true or false")
    if defer and any(item.get(k) is not None for k in ("module", "code", "site")):
        raise ConfigError(where, item, "'defer' applies to frame rules ('function' / 'file')")
    for name in _GLOB_KEYS:
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}.{name}", value, "expected a glob string")
    if all(item.get(k) is None for k in _GLOB_KEYS):
        raise ConfigError(
            where,
            item,
            "a rule needs 'function' or 'file' (or 'module' / 'code' / 'site' for compiled code)",
        )
    return OwnerRule(
        owner,
        item.get("function"),
        item.get("file"),
        item.get("module"),
        item.get("code"),
        item.get("site"),
        line,
        defer,
    )


def _line(frame: Sequence[Any]) -> int:
    try:
        return int(frame[1])
    except (TypeError, ValueError):
        return -1


def _fmt_frame(frame: Sequence[Any]) -> str:
    return f"{frame[2]} ({frame[0]}:{frame[1]})"


def _inductor(owner: str) -> bool:
    """``unattributed:call (<2 chars>/c<hash>.py)``: a frame of Inductor's generated code."""
    prefix = f"{UNATTRIBUTED}:call ("
    return (
        owner.startswith(prefix)
        and owner.endswith(")")
        and generated_key(owner[len(prefix) : -1]) is not None
    )


def owner_key(owner: str) -> str:
    """The owner a name stands for: Inductor's hashed file names are all ``compiled_piece``."""
    return COMPILED_PIECE if _inductor(owner) else owner
