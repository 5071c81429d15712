"""The capture plans (vLLM 0.33.0's sizing and the seed's five fields) for this start's config."""

from __future__ import annotations

from memest.schema import CapturePlan, RunConfig


def capture_plans(config: RunConfig) -> list[CapturePlan]:
    """Both plans for the run's config, from memest.plan (empty when it cannot resolve them)."""
    import memest.plan as plan

    resolve = getattr(plan, "resolve_plan", None)
    if resolve is None or config.max_num_seqs is None or config.max_num_batched_tokens is None:
        return []
    out: list[CapturePlan] = []
    for sizing in ("vllm-0.33.0", "seed"):
        out.append(
            resolve(
                sizing=sizing,
                sm100=False,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                spec_method=config.speculative_method,
                num_speculative_tokens=config.num_speculative_tokens,
                cudagraph_mode=config.cudagraph_mode,
            )
        )
    return out
