"""The capture plans (vLLM 0.33.0's sizing and the seed's five fields) for this start's config."""

from __future__ import annotations

from memest.schema import CapturePlan, RunConfig


def capture_plans(config: RunConfig, *, sm100: bool = False, gpu: str = "") -> list[CapturePlan]:
    """Both plans for the run's config from memest.plan: seed sizing first, then vLLM 0.33.0's.

    Raises:
        ConfigError: the config has no scheduler limits, or memest.plan rejects it.
    """
    from memest.errors import ConfigError
    from memest.plan import plan_input_from_compilation_config, resolve_both

    if config.max_num_seqs is None or config.max_num_batched_tokens is None:
        raise ConfigError("config", config.model, "max_num_seqs / max_num_batched_tokens unknown")
    compilation: dict[str, object] = {}
    if config.cudagraph_mode:
        compilation["cudagraph_mode"] = config.cudagraph_mode
    inp = plan_input_from_compilation_config(
        compilation,
        sm100=sm100,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        spec_method=config.speculative_method,
        num_speculative_tokens=config.num_speculative_tokens,
        gpu=gpu,
    )
    seed, main = resolve_both(inp)
    return [seed, main]
