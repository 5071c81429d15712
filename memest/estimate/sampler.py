"""The profile run's full-batch sampler pass, in a model's dimensions (vLLM 0.33.0, Model Runner V2).

vLLM's profile run (``v1/worker/gpu/model_runner.py`` profile_run) pushes max_num_batched_tokens
tokens through the model, then ``_dummy_sampler_run`` samples one row per dummy request:
min(max_num_batched_tokens, max_num_seqs) rows, with default options and once more with
``SamplingParams.for_sampler_warmup``'s (top-k, top-p, min-p, penalties, logit bias, logprobs).
Per row of the vocabulary the pass requests:

- the logits of ``compute_logits``, in the model's dtype (kept for the raw logprobs);
- ``Sampler.sample``'s float32 copy (``torch.empty_like(logits, dtype=torch.float32)``).

Logit bias, penalties, temperature, min-p, top-k/top-p (the Triton kernel with its persistent
buffer, memest.estimate.runner_buffers) and the Gumbel sampling work in place; the logprobs are
computed for the top-k + 1 tokens only (``v1/worker/gpu/sample/logprob.py``). No other
vocabulary-wide tensor is requested.

By then the forward's activations are free in the caching allocator: a sampler request takes the
best-fitting freed forward block and reserves a segment only when none fits. The reserve is what
the allocator model (memest.estimate.allocsim) adds for these requests over the forward's free
segments: nothing at a few hundred rows, one float32 logits segment at ``vllm serve``'s 1,024
(Llama-3-8B, vocabulary 128,256: 0.489 GiB; the repo's default-flags starts measured 1.648 GiB
of activation headroom against the forward law's 1.157).

The reserve belongs to the batch step (max_num_seqs rows sampled at once), not to a prefill over
cached context (memest.estimate.mla_context): at the budget's edge the allocator releases cached
free segments and retries before it fails (``release_cached_blocks``), so transients of two
different steps combine by max, never by sum.
"""

from __future__ import annotations

from memest.estimate.allocsim import PoolSim, round_size, segment_size
from memest.estimate.model_shape import ModelShape

FP32_BYTES = 4


def sampler_rows(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Rows the profile run's sampler pass samples: one per dummy request."""
    return max(min(max_num_seqs, max_num_batched_tokens), 0)


def sampler_requests(shape: ModelShape, rows: int) -> list[int]:
    """Bytes of the vocabulary-wide tensors the pass requests, in order (all live together)."""
    if rows <= 0:
        return []
    cells = rows * shape.vocab
    return [cells * shape.dtype_bytes, cells * FP32_BYTES]


def forward_free_segments(shape: ModelShape, tokens: int) -> list[int]:
    """Segments the forward of ``tokens`` tokens leaves free for the sampler, widest tensors of
    one decoder layer as memest.estimate.model_shape.layer_token_bytes counts them (five
    hidden-wide tensors, the attention input projection, the KV written, the MLP's gate_up and
    activation), each a segment of its own: requests of 10 MiB and more get one sized to them."""
    gate_up, act = shape.mlp_widths
    widths = [shape.hidden] * 5 + [shape.qkv, shape.kv, gate_up, act]
    return [segment_size(round_size(tokens * w * shape.dtype_bytes)) for w in widths if w > 0]


def sampler_reserve_bytes(shape: ModelShape, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Reservation the full-batch sampler pass adds over the forward's freed segments.

    ``shape`` is the one the activation law reads (a MoE layer without its routed experts'
    caches, which live in the persistent fused-MoE workspace).
    """
    requests = sampler_requests(shape, sampler_rows(max_num_seqs, max_num_batched_tokens))
    if not requests:
        return 0
    sim = PoolSim()
    addr = 0
    for size in forward_free_segments(shape, max_num_batched_tokens):
        sim.seed_segment([(addr, size, False)])
        addr += size + (2 << 20)  # segments never touch, so they never merge
    for i, size in enumerate(requests):
        sim.alloc(i, size, stream=0, index=i)
    return sim.result().reserved_bytes
