"""A DFlash/DSpark drafter's weights as vLLM 0.33.0 keeps them (qwen3_dflash.py, qwen3_dspark.py,
v1/worker/gpu/spec_decode/dspark/utils.py load_dspark_model), counted by hand.

The drafter shares the target's embed_tokens when its input vocabulary is not larger, and the
target's lm_head when its output vocabulary is the same; it adds an fc over the target's auxiliary
hidden states, a mask embedding and a hidden norm, and for DSpark a Markov head of two
vocabulary x markov_rank matrices.
"""

from __future__ import annotations

from memest.estimate.model_shape import model_shape
from memest.estimate.terms.shape import parameter_bytes

#: The lab's DSpark draft for the Qwen3-8B target (lab/models/dspark_qwen3_8b_2l/config.json).
DSPARK = {
    "architectures": ["Qwen3DSparkModel"],
    "model_type": "qwen3",
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "num_hidden_layers": 2,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "target_layer_ids": [1, 5, 10],
    "markov_rank": 256,
}
TARGET_VOCAB = 151936

# Elements, by hand. One Qwen3 layer: qkv (32 + 8 + 8 heads x 128) x 4096, o 4096 x 4096,
# gate_up 2 x 12288 x 4096, down 4096 x 12288; two RMSNorms of 4096 and q/k norms of 128.
LAYER = (4096 + 1024 + 1024) * 4096 + 4096 * 4096 + 2 * 12288 * 4096 + 4096 * 12288
NORMS = 2 * 4096 + 2 * 128
FC = 3 * 4096 * 4096  # three target layers' hidden states -> hidden
HEADS = 4096 + 4096 + 4096  # final norm, mask embedding, hidden norm
MARKOV = 256 * (151936 + 151936)
ROTARY = 40960 * 128
SHARED_ELEMS = 2 * (LAYER + NORMS) + FC + HEADS + MARKOV + ROTARY


def test_dspark_shares_the_targets_vocabulary() -> None:
    shape = model_shape(DSPARK)
    assert (shape.dflash_aux_layers, shape.markov_rank, shape.qk_norm) == (3, 256, True)
    assert parameter_bytes(shape, target_vocab=TARGET_VOCAB) == 2 * SHARED_ELEMS
    assert 2 * SHARED_ELEMS == 1_038_541_824


def test_a_larger_draft_vocabulary_keeps_its_own_embedding_and_lm_head() -> None:
    # 151,936 draft rows over a 128,256-row target: neither can be the target's
    shape = model_shape(DSPARK)
    own = 2 * 151936 * 4096
    assert parameter_bytes(shape, target_vocab=128256) == 2 * (SHARED_ELEMS + own)


def test_dflash_without_a_markov_head_and_with_its_layer_count_as_fc_width() -> None:
    cfg = {**DSPARK, "architectures": ["DFlashDraftModel"]}
    del cfg["target_layer_ids"], cfg["markov_rank"]
    shape = model_shape(cfg)
    assert (shape.dflash_aux_layers, shape.markov_rank) == (2, 0)
    expected = 2 * (LAYER + NORMS) + 2 * 4096 * 4096 + HEADS + ROTARY
    assert parameter_bytes(shape, target_vocab=TARGET_VOCAB) == 2 * expected
