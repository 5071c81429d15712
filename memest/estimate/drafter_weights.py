"""A Llama-family EAGLE / EAGLE3 drafter's weights in vLLM 0.33.0, from its config's shapes.

vLLM 0.33.0 (model_executor/models/llama_eagle3.py, llama_eagle.py) builds the drafter as:

=========================  ===========================================  ======================
tensor                     shape                                        kept?
=========================  ===========================================  ======================
fc                         (target hidden x aux states) x hidden        always (EAGLE3: 3
                           (EAGLE: 2 hidden x hidden)                   aux states by default)
per layer: qkv_proj        (2 hidden for layer 0 of EAGLE3, else        always
                           hidden) x (heads + 2 kv heads) x head_dim
per layer: o_proj          heads x head_dim x hidden                    always
per layer: gate_up_proj    hidden x 2 intermediate                      always
per layer: down_proj       intermediate x hidden                        always
per layer: norms           3 x hidden (EAGLE3: input, hidden,           always
                           post-attention; EAGLE: 2)
final norm                 hidden                                       always
lm_head                    draft vocabulary x hidden                    own when the draft
                                                                        vocabulary differs from
                                                                        the target's; else the
                                                                        target's is shared
d2t (draft_id_to_target)   draft vocabulary x int64                     when the vocabularies
                                                                        differ
embed_tokens               vocabulary x hidden                          shared with the target
=========================  ===========================================  ======================

``load_eagle_model`` (v1/worker/gpu/spec_decode/eagle/utils.py) deletes the drafter's own
embedding and lm_head and points at the target's unless the checkpoint carries its own copy that
differs, so a drafter of the target's vocabulary normally owns neither. The weights phase counts
allocated bytes, so what is created and dropped while loading does not count.

Real H200 starts (Llama-3-8B shape + EAGLE3, one layer, vocabulary shared): 560.0 MiB modelled,
558.3 to 562.2 MiB measured between starts with and without the drafter
(reports/vllm/whatif_terms.txt).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError

#: PyTorch's caching allocator rounds every block up to this many bytes.
_ROUND = 512
#: EAGLE3's default number of auxiliary hidden states the fc layer concatenates.
EAGLE3_AUX_STATES = 3
#: Bytes of one draft_id_to_target_id entry (int64).
_D2T_BYTES = 8


def _blocks(*sizes: int) -> int:
    return sum(math.ceil(n / _ROUND) * _ROUND for n in sizes if n > 0)


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"drafter config.{key}", value, "missing or not a positive integer")
    return value


def _layer_bytes(config: Mapping[str, Any], qkv_in: int, dtype_bytes: int) -> int:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    inter = _int(config, "intermediate_size")
    return _blocks(
        qkv_in * (heads + 2 * kv_heads) * head_dim * dtype_bytes,
        heads * head_dim * hidden * dtype_bytes,
        hidden * 2 * inter * dtype_bytes,
        inter * hidden * dtype_bytes,
    )


def drafter_weight_bytes(
    drafter: Mapping[str, Any], target: Mapping[str, Any], method: str, dtype_bytes: int
) -> int:
    """Bytes of weights a Llama-family EAGLE / EAGLE3 drafter adds to the target's (see above).

    Raises:
        ConfigError: a shape the layout needs is missing, or the method is not EAGLE / EAGLE3.
    """
    if method not in ("eagle", "eagle3"):
        raise ConfigError("speculative_config.method", method, "drafter weights: eagle / eagle3")
    hidden = _int(drafter, "hidden_size")
    layers = _int(drafter, "num_hidden_layers", 1)
    vocab = _int(target, "vocab_size")
    draft_vocab = drafter.get("draft_vocab_size") or drafter.get("vocab_size") or vocab
    eagle3 = method == "eagle3"
    if eagle3:
        aux = drafter.get("num_aux_hidden_states") or EAGLE3_AUX_STATES
        fc_in = (drafter.get("target_hidden_size") or hidden) * aux
    else:
        fc_in = 2 * hidden
    total = _blocks(fc_in * hidden * dtype_bytes)
    for i in range(layers):
        qkv_in = 2 * hidden if eagle3 and i == 0 else hidden
        total += _layer_bytes(drafter, qkv_in, dtype_bytes)
        total += _blocks(*[hidden * dtype_bytes] * (3 if eagle3 else 2))
    total += _blocks(hidden * dtype_bytes)  # final norm
    if draft_vocab != vocab:
        total += _blocks(draft_vocab * hidden * dtype_bytes, draft_vocab * _D2T_BYTES)
    return total
