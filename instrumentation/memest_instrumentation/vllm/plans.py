"""The capture plans (vLLM 0.33.0's sizing and the seed's five fields) for this start's config."""

from __future__ import annotations

from memest.schema import CapturePlan, RunConfig


def capture_plans(config: RunConfig, *, sm100: bool = False, gpu: str = "") -> list[CapturePlan]:
    """Both plans for the run's config from memest.plan: seed sizing first, then vLLM 0.33.0's.

    Raises:
        ConfigError: the config has no scheduler limits, or memest.plan rejects it.
    """
    from memest.plan import resolve_both
    from memest.plan.overlay import plan_input

    seed, main = resolve_both(plan_input(config, sm100=sm100, gpu=gpu))
    return [seed, main]
