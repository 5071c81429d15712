"""Which capture stage a vLLM CudaGraphManager call is: from its progress bar and descriptor."""

from __future__ import annotations

from typing import Any

from memest.plan.inputs import BLOCK_DRAFTERS


def role_of(progress_bar_desc: str) -> str:
    """Which graph family a CudaGraphManager.capture call is, from its progress-bar text."""
    text = progress_bar_desc.lower()
    if "prefill" in text:
        return "draft.step0"
    if "decode" in text and "replay" not in text:
        return "draft.steps"
    # Block drafters name themselves in the progress bar; "xpress" is one more such routine.
    for name in (*BLOCK_DRAFTERS, "xpress"):
        if name in text:
            return "draft.block"
    if "multi-module mtp" in text:
        return "draft.mtp"
    if "decoder replay" in text:
        return "target.replay"
    return "target"


def stage_of(role: str, desc: Any) -> str:
    """Stage name from the role and a BatchExecutionDescriptor (hook map 3.2)."""
    mode = getattr(getattr(desc, "cg_mode", None), "name", str(getattr(desc, "cg_mode", "")))
    if mode == "PIECEWISE":
        return f"{role}.piecewise"
    if (
        role == "target"
        and getattr(desc, "uniform_token_count", None) is None
        and getattr(desc, "max_query_len", None)
    ):
        return "target.av"
    if role == "draft.steps":
        return "draft.steps.full"
    return f"{role}.full"
