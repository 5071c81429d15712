"""The profile pass's activation headroom in a model's dimensions (vLLM 0.33.0).

vLLM's profile run pushes ``max_num_batched_tokens`` tokens through the target and, with a
speculative drafter, through the drafter: the activation headroom is linear in those tokens, in
one decoder layer's token bytes of each model (memest.estimate.model_shape.layer_token_bytes), with
one factor for the target and one for the drafter's share. The factors are fitted from measured
starts per GPU kind and vLLM version (memest.preflight.calibration); the pre-flight reads the whole
law, the what-if scales the target's share from what its start measured and takes only the
drafter's factor (see memest.estimate.whatif).

The pass's sampler samples max_num_seqs rows after the forward: what that adds over the forward's
freed segments is derived, not fitted (memest.estimate.sampler); ``profile_pass_bytes`` is the
one sum of both.
"""

from __future__ import annotations

from dataclasses import replace

from memest.estimate.linear_prefill import prefill_backend
from memest.estimate.model_shape import ModelShape, layer_token_bytes
from memest.estimate.sampler import sampler_reserve_bytes


def target_activation_bytes(tokens: int, target: ModelShape, factor: float) -> float:
    """The target's share: ``factor`` x tokens x one target layer's token bytes."""
    return factor * tokens * layer_token_bytes(target)


def drafter_activation_bytes(tokens: int, drafter: ModelShape, factor: float) -> float:
    """The drafter's share: ``factor`` x tokens x one drafter layer's token bytes."""
    return factor * tokens * layer_token_bytes(drafter)


def activation_bytes(
    tokens: int,
    target: ModelShape,
    factor: float,
    drafter: ModelShape | None = None,
    drafter_factor: float = 0.0,
) -> int:
    """Activation headroom of a profile pass of ``tokens`` tokens (target, plus the drafter's)."""
    total = target_activation_bytes(tokens, target, factor)
    if drafter is not None:
        total += drafter_activation_bytes(tokens, drafter, drafter_factor)
    return round(total)


def activation_shape(shape: ModelShape) -> ModelShape:
    """The shape the activation law reads: a MoE layer without its routed experts' caches.

    vLLM 0.33.0's Triton experts (``fused_moe/experts/triton_moe.py`` apply) write w13's output,
    the activation and w2's output into views of workspace13 / workspace2, the persistent
    fused-MoE workspace the profiling residue holds (memest.estimate.fused_moe); the layer's
    activations are its hidden-wide tensors, the shared experts' MLP and the dense layers'.
    """
    if not shape.moe_layers:
        return shape
    return replace(shape, topk=0)


def sampler_reserve(
    shape: ModelShape,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    gdn_backend: str | None = None,
) -> int:
    """A full-batch step's reserve (memest.estimate.sampler: linear-attention prefill, sampler,
    prompt-logprobs chunk), read on the activation law's shape; ``gdn_backend`` the recorded
    GDN prefill backend (None: vLLM's SM90 default)."""
    return sampler_reserve_bytes(
        activation_shape(shape),
        max_num_seqs,
        max_num_batched_tokens,
        prefill_backend(gdn_backend),
    )


def profile_pass_bytes(
    tokens: int,
    max_num_seqs: int,
    target: ModelShape,
    factor: float,
    drafter: ModelShape | None = None,
    drafter_factor: float = 0.0,
) -> int:
    """Serving's activation headroom: the profile pass's forward law plus a full-batch step's
    sampler and prompt-logprobs reserve."""
    forward = activation_bytes(tokens, activation_shape(target), factor, drafter, drafter_factor)
    return forward + sampler_reserve(target, max_num_seqs, tokens)
