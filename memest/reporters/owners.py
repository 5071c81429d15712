"""What an owner is called and drawn as, on every surface: one readable label, one colour.

Owner names are the analysis's (``memest.analysis.owners``): the eager rules' owners, the
owners of torch.compile'd code named through Inductor's generated code (``qkv_proj``,
``mlp_gate_up``, ...), and ``compiled_piece:<why>`` for compiled code no rule names. Reports
written before Inductor's generated code was named ``compiled_piece`` carry
``unattributed:call (<2 chars>/c<hash>.py)`` instead. :func:`owner_key` makes the two one owner,
so runs compare across that change, and :func:`owner_label` says what each is instead of a file
hash or a rule name. Colours come from one fixed
qualitative palette: a named owner always has its colour, any other owner a colour picked by a
hash of its key, so an owner has the same colour on every page.
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath

from memest.analysis.inductor import NO_MODULE_MAP
from memest.analysis.owners import COMPILED_PIECE, NO_STACK, UNATTRIBUTED, owner_key
from memest.analysis.stages import REMAINDER_OWNER

#: Readable label per named owner (the analysis's owner names).
OWNER_LABELS = {
    "indexer_logits_fp32": "indexer logits, FP32 copy",
    "indexer_logits_bf16": "indexer logits, BF16",
    "indexer_logits_fp32_kernel": "indexer logits, FP32 (the kernel's own output)",
    "indexer_q": "indexer query (FP8) and per-head weights",
    "indexer_topk": "indexer top-k indices",
    "aux_hidden_states": "aux hidden states (drafter inputs)",
    "draft_logits": "draft logits",
    "draft_logits.step": "draft logits of one draft step (DSpark: base + Markov bias)",
    "draft_logits.markov_bias": "DSpark Markov bias of one draft step",
    "draft_markov_embed": "DSpark Markov embedding of the previous draft token",
    "draft_sample_hidden": "drafter hidden states gathered for its lm_head",
    "draft_sampler": "draft token ids and sampler scratch",
    "draft_context_kv": "drafter context K/V (projected, normed, roped)",
    "attn_output": "attention output",
    "qnorm_rope_kv_insert": "q-norm / RoPE / KV insert",
    "moe_workspace": "MoE workspace",
    "gemm_workspace": "GEMM workspace",
    "kv_cache": "KV cache",
    "weights": "weights",
    "sampler": "sampler buffers",
    # owners of torch.compile'd code, named through Inductor's generated code
    "qkv_proj": "QKV projection output",
    "qk_norm_rope": "q/k-norm + RoPE",
    "o_proj": "attention output projection",
    "moe_router_logits": "MoE router logits",
    "mlp_gate_up": "MLP gate/up projection",
    "mlp_act": "MLP activation (SiLU x up)",
    "mlp_down": "MLP down projection",
    "eagle3_fc": "EAGLE3 input projection (fc)",
    "norm": "RMSNorm output",
    "embedding": "token embeddings",
    "logits": "logits (lm_head)",
    "residual": "residual stream (layer output)",
    "graph_output": "CUDA-graph output buffer (hidden states FULL graphs write)",
    "graph_capture_state": "CUDA-graph capture state (torch generator seed / offset)",
    "cublas_workspace": "cuBLAS workspace (torch, one per capture stream)",
    "qkv_input": "QKV projection input (EAGLE3: both norms concatenated)",
    "mla_prefill_workspace": "MLA chunked-prefill workspace",
    "mla_prefill": "MLA prefill (k and attention)",
    "mla_decode": "MLA decode (latent q, output and LSE)",
    COMPILED_PIECE: "compiled code (Inductor call; owner not named)",
    "graph_pool_live_blocks": "graph-pool blocks live at the end of init",
    "default_pool_allocated_during_capture": "default-pool tensors kept from the capture",
    REMAINDER_OWNER: "other pool growth (no recorded allocation explains it)",
}

#: Fixed colour per named owner (a qualitative palette: distinct hues, none grey but the remainder).
OWNER_COLORS = {
    "indexer_logits_fp32": "#d62728",
    "indexer_logits_bf16": "#ff7f0e",
    "indexer_logits_fp32_kernel": "#f7b6d2",
    "indexer_q": "#fdae6b",
    "indexer_topk": "#e6550d",
    "aux_hidden_states": "#9467bd",
    "draft_logits": "#17becf",
    "attn_output": "#1f77b4",
    "qnorm_rope_kv_insert": "#2ca02c",
    "moe_workspace": "#8c564b",
    "gemm_workspace": "#e377c2",
    "kv_cache": "#bcbd22",
    "weights": "#3f51b5",
    "sampler": "#6b6ecf",
    "qkv_proj": "#aec7e8",
    "qk_norm_rope": "#98df8a",
    "o_proj": "#3182bd",
    "moe_router_logits": "#c49c94",
    "mlp_gate_up": "#ff9896",
    "mlp_act": "#c5b0d5",
    "mlp_down": "#dbdb8d",
    "eagle3_fc": "#9edae5",
    "norm": "#e7ba52",
    "embedding": "#8ca252",
    "logits": "#ad494a",
    "residual": "#7b4173",
    "graph_output": "#6baed6",
    "graph_capture_state": "#9c9ede",
    "cublas_workspace": "#5254a3",
    "qkv_input": "#8c6d31",
    "mla_prefill_workspace": "#637939",
    "mla_prefill": "#b5cf6b",
    "mla_decode": "#843c39",
    COMPILED_PIECE: "#f0a202",
    "graph_pool_live_blocks": "#7f7f7f",
    "default_pool_allocated_during_capture": "#a1887f",
    REMAINDER_OWNER: "#c7c7c7",
}

#: Colours for owners without a fixed one (distinct from each other and from OWNER_COLORS).
EXTRA_COLORS = (
    "#4e79a7",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#e15759",
    "#9c755f",
    "#86bcb6",
    "#edc948",
    "#ff9da7",
    "#393b79",
    "#637939",
    "#843c39",
)


def owner_label(owner: str) -> str:
    """What the owner is, in words (the raw name belongs in a tooltip)."""
    key = owner_key(owner)
    if key in OWNER_LABELS:
        return OWNER_LABELS[key]
    if key == f"{COMPILED_PIECE}:{NO_MODULE_MAP}":
        return (
            "compiled code — owner not named: this code was compiled in a start without memest, "
            "so its module map was never recorded (start once with memest on and a cold compile "
            "cache, or keep maps across starts in MEMEST_CODE_MAP_DIR)"
        )
    if key.startswith(f"{COMPILED_PIECE}:"):
        return f"compiled code — owner not named: {key[len(COMPILED_PIECE) + 1 :]}"
    if not key.startswith(f"{UNATTRIBUTED}:"):
        return key.replace("_", " ")
    rest = key[len(UNATTRIBUTED) + 1 :]
    if rest == NO_STACK:
        return "no stack recorded (owner not named)"
    func, sep, path = rest.partition(" (")
    if not sep:
        return f"{rest} (owner not named)"
    return f"allocated in {func} ({PurePosixPath(path.rstrip(')')).name}); owner not named"


def owner_color(owner: str) -> str:
    """The owner's colour: fixed for a named owner, else picked by a hash of its key."""
    key = owner_key(owner)
    if key in OWNER_COLORS:
        return OWNER_COLORS[key]
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return EXTRA_COLORS[digest % len(EXTRA_COLORS)]
