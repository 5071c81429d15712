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

Serving asks for one more vocabulary-wide tensor the profile run never does: a request with
prompt logprobs (``SamplingParams.for_sampler_warmup`` sets ``prompt_logprobs=1``) has its step's
prompt rows scored after sampling, ``compute_logits`` over chunks of ``CHUNK_SIZE`` (1,024) rows
(``v1/worker/gpu/sample/prompt_logprob.py`` compute_prompt_logprobs_with_chunking), in the
model's dtype. The sampler's tensors are freed by then and stay cached; a chunk takes a freed
block that fits or reserves its own segment (Gemma-3's 262,144-entry vocabulary: 512 MiB, which
no freed block of a 4,096-token forward holds).

The profile run skips attention (``skip_attn=True``), and with it a gated-delta-net layer's
recurrence: a full batch of prefills gathers every request's state, FLA's chunk states and the
float32 final states (memest.estimate.linear_prefill), one layer's worth, before the sampler
runs. The step replayed here is serving's widest: one prefill per row over
max_num_batched_tokens tokens, then the sampler, then the chunk. ``serving_step_reserve_bytes``
is what it reserves beyond the profile pass's sampler: the part the measured headroom lacks.

The reserve belongs to the batch step (max_num_seqs rows sampled at once), not to a prefill over
cached context (memest.estimate.mla_context): at the budget's edge the allocator releases cached
free segments and retries before it fails (``release_cached_blocks``), so transients of two
different steps combine by max, never by sum.
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.estimate.allocsim import PoolSim, round_size, segment_size
from memest.estimate.linear_prefill import (
    DEFAULT_GDN_PREFILL_BACKEND,
    GdnPrefillBackend,
    prefill_backend,
    prefill_events,
)
from memest.estimate.model_shape import ModelShape, model_shape
from memest.schema import RunConfig

FP32_BYTES = 4

#: Prompt rows scored per ``compute_logits`` call (vLLM 0.33.0 and 0.34.0: ``CHUNK_SIZE`` of
#: ``v1/worker/gpu/sample/prompt_logprob.py``).
PROMPT_LOGPROBS_CHUNK_ROWS = 1024


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


def prompt_logprobs_rows(max_num_batched_tokens: int) -> int:
    """Rows of the widest prompt-logprobs chunk a step can score."""
    return max(min(PROMPT_LOGPROBS_CHUNK_ROWS, max_num_batched_tokens), 0)


def _freed_forward(shape: ModelShape, max_num_batched_tokens: int) -> PoolSim:
    """An allocator holding the forward's freed segments, each apart (they never merge)."""
    sim = PoolSim()
    addr = 0
    for size in forward_free_segments(shape, max_num_batched_tokens):
        sim.seed_segment([(addr, size, False)])
        addr += size + (2 << 20)
    return sim


def _sample(sim: PoolSim, shape: ModelShape, rows: int, first: int) -> int:
    """The sampler's requests (all live together), then freed; the next free handle."""
    requests = sampler_requests(shape, rows)
    for i, size in enumerate(requests, start=first):
        sim.alloc(i, size, stream=0, index=i)
    for i in range(first, first + len(requests)):
        sim.free(i)
    return first + len(requests)


def _linear_prefill(
    sim: PoolSim, shape: ModelShape, rows: int, tokens: int, backend: GdnPrefillBackend
) -> int:
    """One gated-delta-net layer's prefill of ``rows`` requests over ``tokens`` tokens, freed by
    its end (memest.estimate.linear_prefill); the next free handle."""
    if shape.gdn is None:
        return 0
    events = prefill_events(shape.gdn, tokens, rows, backend)
    for action, handle, size in events:
        if action == "alloc":
            sim.alloc(handle, size, stream=0)
        else:
            sim.free(handle)
    return 1 + max((h for _, h, _ in events), default=-1)


def _batch_step_sim(
    shape: ModelShape,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    gdn_backend: GdnPrefillBackend = DEFAULT_GDN_PREFILL_BACKEND,
) -> tuple[int, int]:
    """(what the profile pass's sampler reserves, what serving's widest full-batch step does:
    linear-attention prefill of every row, the sampler, the prompt-logprobs chunk), both over
    the forward's freed segments."""
    rows = sampler_rows(max_num_seqs, max_num_batched_tokens)
    profile = _freed_forward(shape, max_num_batched_tokens)
    _sample(profile, shape, rows, 0)
    serving = _freed_forward(shape, max_num_batched_tokens)
    handle = _linear_prefill(serving, shape, rows, max_num_batched_tokens, gdn_backend)
    handle = _sample(serving, shape, rows, handle)
    chunk = prompt_logprobs_rows(max_num_batched_tokens)
    if chunk:
        serving.alloc(handle, chunk * shape.vocab * shape.dtype_bytes, stream=0)
    return profile.result().reserved_bytes, serving.result().reserved_bytes


def sampler_reserve_bytes(
    shape: ModelShape,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    gdn_backend: GdnPrefillBackend = DEFAULT_GDN_PREFILL_BACKEND,
) -> int:
    """Reservation serving's full-batch step adds over the forward's freed segments: its
    linear-attention prefill, sampler and prompt-logprobs chunk.

    ``shape`` is the one the activation law reads (a MoE layer without its routed experts'
    caches, which live in the persistent fused-MoE workspace).
    """
    return _batch_step_sim(shape, max_num_seqs, max_num_batched_tokens, gdn_backend)[1]


def serving_step_reserve_bytes(
    shape: ModelShape,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    gdn_backend: GdnPrefillBackend = DEFAULT_GDN_PREFILL_BACKEND,
) -> int:
    """What serving's full-batch step adds beyond the profile pass's sampler (the
    prompt-logprobs chunk, the linear-attention prefill): the part a start's measured headroom
    lacks."""
    profile, serving = _batch_step_sim(shape, max_num_seqs, max_num_batched_tokens, gdn_backend)
    return serving - profile


def run_serving_step_bytes(config: RunConfig, shape: ModelShape | None = None) -> int:
    """``serving_step_reserve_bytes`` for one start, on the activation law's shape: from
    ``shape`` (a what-if's model, the one its movers read: config.json where given, which may
    hold fields a report recorded before it knew them), else from the recorded dimensions, else
    0; its recorded GDN prefill backend, else vLLM's SM90 default."""
    from memest.estimate.activation import activation_shape

    if not config.max_num_batched_tokens:
        return 0
    dims = config.model_dims
    if shape is None and dims is not None:
        try:
            shape = model_shape(
                dims.model_dump(exclude_none=True) | {"torch_dtype": dims.dtype},
                tp=config.tensor_parallel_size,
            )
        except ConfigError:
            shape = None
    if shape is None:
        return 0
    return serving_step_reserve_bytes(
        activation_shape(shape),
        config.max_num_seqs or 1,
        config.max_num_batched_tokens,
        prefill_backend(config.gdn_prefill_backend),
    )
