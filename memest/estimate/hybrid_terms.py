"""Terms a hybrid model's own layers bring, from vLLM 0.33.0's model code.

Weights (the pre-flight's weights law): where a hybrid architecture's parameters or buffers differ
from what the shape law (memest.estimate.terms.shape.parameter_bytes) counts for a dense model,
its bytes come from here, derived from the architecture's vLLM model class:

==================  =============================================================================
architecture        what differs from the dense law (vLLM 0.33.0 source)
==================  =============================================================================
Gemma3ForCausalLM   lm_head tied unless tie_word_embeddings is false (Gemma3TextConfig's default);
                    four RMSNorms per layer plus q_norm and k_norm (gemma3.py Gemma3DecoderLayer,
                    Gemma3Attention); one rotary cos/sin cache per distinct rope_parameters of the
                    layer types present (get_rope shares identical ones), each max_position x
                    factor rows (linear scaling, linear_scaling_rope.py) x head_dim in the dtype
==================  =============================================================================

Architectures not in the table keep the shape law.

Block tables (the runner-buffer term): Model Runner V2 allocates one block table per KV-cache group
(memest.estimate.runner_buffers.GroupTable, block_table_width).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memest.estimate.layer_kinds import layer_kinds
from memest.estimate.model_shape import ModelShape
from memest.estimate.terms.shape import parameter_bytes

#: vLLM 0.33.0's LinearScalingRotaryEmbedding: its cache holds max_position x factor rows.
_LINEAR_ROPE = "linear"


def _gemma3_rope_rows(cfg: Mapping[str, Any], max_position: int) -> int:
    """Rows of Gemma 3's rotary caches: one per distinct rope of the layer types present.

    Gemma3TextConfig's rope_parameters: sliding layers take rope_local_base_freq with default
    rope, full layers rope_theta with the config's rope_scaling (transformers builds them so)."""
    kinds = set(layer_kinds(cfg))
    scaling = cfg.get("rope_scaling") or {}
    ropes: set[tuple[Any, ...]] = set()
    if "sliding_window" in kinds:
        ropes.add((cfg.get("rope_local_base_freq", 10_000.0), "default", 1.0))
    if "full_attention" in kinds:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        factor = float(scaling.get("factor", 1.0)) if kind == _LINEAR_ROPE else 1.0
        ropes.add((cfg.get("rope_theta", 1_000_000.0), kind, factor))
    return sum(int(max_position * factor) for _, _, factor in ropes)


def _gemma3_bytes(cfg: Mapping[str, Any], s: ModelShape) -> int:
    tied = bool(cfg.get("tie_word_embeddings", True))
    # the dense law without its one rotary cache (Gemma 3's are counted below) and with q/k norms
    dense = parameter_bytes(dataclasses.replace(s, tied=tied, qk_norm=True, max_position=0))
    norms = 2 * s.hidden * s.num_layers  # pre/post-feedforward norms beside the dense law's two
    rope = _gemma3_rope_rows(cfg, s.max_position) * s.head_dim
    return dense + (norms + rope) * s.dtype_bytes


_WEIGHTS = {"Gemma3ForCausalLM": _gemma3_bytes}


def weight_bytes(cfg: Mapping[str, Any] | None, s: ModelShape) -> int | None:
    """One rank's parameter and buffer bytes of a hybrid architecture (None: the shape law's).

    ``cfg`` is the model's config.json (its text part where it has one)."""
    if cfg is None:
        return None
    text = cfg.get("text_config")
    law = _WEIGHTS.get(s.architecture)
    if law is None:
        return None
    return law(text if isinstance(text, Mapping) else cfg, s)


def uses_hybrid_weights(architecture: str) -> bool:
    return architecture in _WEIGHTS

