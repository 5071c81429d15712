"""The profile pass's activation headroom in a model's dimensions (vLLM 0.33.0).

vLLM's profile run pushes ``max_num_batched_tokens`` tokens through the target and, with a
speculative drafter, through the drafter: the activation headroom is linear in those tokens, in
one decoder layer's token bytes of each model (memest.estimate.model_shape.layer_token_bytes), with
one factor for the target and one for the drafter's share. The factors are fitted from measured
starts per GPU kind and vLLM version (memest.preflight.calibration); the pre-flight reads the whole
law, the what-if scales the target's share from what its start measured and takes only the
drafter's factor (see memest.estimate.whatif).
"""

from __future__ import annotations

from memest.estimate.model_shape import ModelShape, layer_token_bytes


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
