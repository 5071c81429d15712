"""memest's second, warm profile pass: the activation headroom read again after vLLM's own profile
run, from an empty allocator cache, with the context managers that keep the pass to what a
serving step takes (no full garbage collection, no MLA context stand-in, no eager DFlash / DSpark
draft block when serving replays it from its FULL graphs).

Runs inside ``guarded`` (hooks.py's ``_after_determine``), so a failure is logged and vLLM goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from memest.estimate.phases import warm_pass_headroom
from memest.schema import PhaseRecord
from memest_instrumentation.vllm import measure
from memest_instrumentation.vllm.state import state


def warm_profile_peak(worker: Any) -> None:
    """Measure the activation headroom again in a second, warm profile pass.

    vLLM's own figure is the allocated peak of its profile run, which has two faults as a
    budget term: a first start compiles inside that run, and torch.compile's transients
    inflate the peak (1.32 GiB against 0.55 GiB warm for Llama-8B with EAGLE3 on an H200); and
    allocated bytes are not what serving's first full-size step takes from the device, which is
    the allocator's reservation, block rounding and segment sizes included (0.69 GiB there).
    So memest runs the profile pass once more, after vLLM's, from an empty allocator cache and
    reads the reservation it adds (phase ``profile_run.warm``).
    """
    from memest_instrumentation.vllm.patches import original

    st = state()
    runner = worker.model_runner
    bound = runner.profile_run
    base = original(bound)
    randomize = bool(getattr(worker, "randomize_dummy_inputs", False))
    torch = measure._torch() if measure.cuda_ready() else None
    try:
        from vllm.config import set_current_vllm_config

        config_ctx: Any = set_current_vllm_config(worker.vllm_config)
    except Exception:
        config_ctx = contextlib.nullcontext()
    # Read before the pass: a wrapper memest could not unwrap would overwrite it.
    first = st.figures.profile_headroom_bytes or 0
    measure.settle()
    measure.reset_peak()
    start = measure.reading(pools=False)
    began = time.monotonic()
    with (
        torch.inference_mode() if torch is not None else contextlib.nullcontext(),
        config_ctx,
        _without_mla_standin(getattr(worker, "vllm_config", None)) as standins,
        _without_graphed_draft_block(runner) as graphed_up_to,
        _without_full_collection(),
    ):
        if base is bound:
            bound(randomize_inputs=randomize)
        else:
            base(runner, randomize_inputs=randomize)
    end = measure.reading(pools=False)
    pass_s = time.monotonic() - began
    measure.settle()
    st.phases.append(PhaseRecord(name="profile_run.warm", start=start, end=end))
    warm = warm_pass_headroom(start, end)
    st.figures.profile_headroom_bytes = warm
    if standins and st.config is not None:
        st.config = st.config.model_copy(update={"mla_warm_pass_without_standin": True})
    # vLLM counts a load from its compile cache among its compilations: the note says both.
    compiled = (
        " (torch.compile compiled or loaded the model in it)"
        if st.figures.profile_run_compiled
        else ""
    )
    without = f" without the MLA context stand-in of {standins} layers" if standins else ""
    if graphed_up_to:
        without += (
            " and without the drafter's block routine (serving replays it from its FULL graphs "
            f"for every batch of up to {graphed_up_to} requests: its memory is in the graph pools)"
        )
    st.notes.append(
        f"activation headroom: vLLM's profile run{compiled} peaked {first} B above what it left "
        f"allocated; a second, warm profile pass{without} added {warm} B of reservation in "
        f"{pass_s:.2f} s; the estimate uses the second"
    )


@contextlib.contextmanager
def _without_full_collection() -> Iterator[None]:
    """vLLM's ``profile_run`` ends with ``gc.collect()``, a full collection of the worker's heap
    that costs more than the pass's forward on a small model. The pass creates no reference
    cycles that hold device memory (its tensors are freed by reference counting), and its
    reading is taken from the allocator, so for the pass alone the call is a no-op."""
    import gc

    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


@contextlib.contextmanager
def _without_mla_standin(vllm_config: Any) -> Iterator[int]:
    """The model's MLA layers without their profile-run stand-in; yields how many were changed.

    Run without attention metadata, vLLM 0.33.0's ``MLAAttention.forward_impl`` allocates one
    [chunked_prefill_workspace_size, heads, qk_nope + v] tensor standing in for an up-projected
    context chunk, its width read through a property over ``_chunked_prefill_workspace_size``.
    No serving step allocates it, and in the warm pass its segments absorb the pass's other
    blocks, so the reservation read would be the stand-in's rather than the step's. With the
    width at 0 for the pass the tensor is empty; memest.estimate.mla_context then counts the
    whole chunk.
    """
    compilation = getattr(vllm_config, "compilation_config", None)
    layers = getattr(compilation, "static_forward_context", None) or {}
    saved = [
        (layer, layer._chunked_prefill_workspace_size)
        for layer in layers.values()
        if hasattr(layer, "_chunked_prefill_workspace_size")
        and isinstance(getattr(type(layer), "chunked_prefill_workspace_size", None), property)
    ]
    try:
        for layer, _ in saved:
            layer._chunked_prefill_workspace_size = 0
        yield len(saved)
    finally:
        for layer, width in saved:
            layer._chunked_prefill_workspace_size = width


def draft_block_graphed_up_to(speculator: Any) -> int:
    """The request count up to which serving runs a DFlash-family drafter's block routine only
    from its FULL graphs; 0 when some batch of up to max_num_seqs requests would run it eagerly.

    vLLM 0.33.0's ``DFlashSpeculator.propose`` (DSpark's too) gives every request exactly
    ``num_query_per_req`` query tokens, so it dispatches each batch, mixed target batches
    included, to its ``query_cudagraph_manager`` with ``uniform_token_count`` set, and eagerly
    (``need_eager``) only in the profile run. Request counts are read against the manager's
    candidates with vLLM's own ``_is_compatible`` (its ``dispatch``, less the captured-yet check:
    the pass runs before the capture). LoRA cases other than none: 0 (not modelled).
    """
    manager = getattr(speculator, "query_cudagraph_manager", None)
    per_req = getattr(speculator, "num_query_per_req", None)
    if manager is None:
        manager = prospective_query_manager(speculator)
    candidates = getattr(manager, "_candidates", None)
    max_reqs = getattr(manager, "max_num_reqs", None)
    if not (manager is not None and per_req and candidates and max_reqs):
        return 0
    if getattr(manager, "lora_capture_cases", [0]) != [0]:
        return 0
    try:  # vLLM 0.33.0's names; another version keeps the block in the pass
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.cudagraph_utils import _is_compatible
    except ImportError:
        return 0

    for reqs in range(1, int(max_reqs) + 1):
        tokens = reqs * int(per_req)
        match = next(
            (
                d
                for d in candidates.get((tokens, 0), [])
                if _is_compatible(d, reqs, tokens, int(per_req), 0, None, 1)
            ),
            None,
        )
        if match is None or match.cg_mode != CUDAGraphMode.FULL:
            return 0
    return int(max_reqs)


def prospective_query_manager(speculator: Any) -> Any:
    """The query graph manager a DFlash-family speculator will build, or None.

    vLLM 0.33.0 builds it in ``initialize_kv_cache`` (``init_cudagraph_manager``, after
    ``set_attn``), so at the warm pass, which runs before, it does not exist yet. This builds the
    same ``DFlashCudaGraphManager`` as ``init_cudagraph_manager`` would: FULL_DECODE_ONLY when
    the configured mode's decode graphs are FULL and every draft attention layer's metadata
    builder supports uniform batches (``get_attn_cg_support``'s test, from the builder classes,
    since the builders do not exist yet), with the configured capture sizes (vLLM may still
    trim them against the target's attention support: the table is read, never used).
    """
    init = getattr(speculator, "init_cudagraph_manager", None)
    per_req = getattr(speculator, "num_query_per_req", None)
    names = getattr(speculator, "draft_attn_layer_names", None)
    if init is None or not per_req or not names:
        return None
    try:  # vLLM 0.33.0's names; another version keeps the block in the pass
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.attention.backend import AttentionCGSupport
        from vllm.v1.worker.gpu.spec_decode.dflash.cudagraph import DFlashCudaGraphManager
        from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    except ImportError:
        return None
    if not isinstance(speculator, DFlashSpeculator):
        return None
    config = speculator.vllm_config
    if config.compilation_config.cudagraph_mode.decode_mode() != CUDAGraphMode.FULL:
        return None
    attn_config = speculator.attn_vllm_config
    layers = config.compilation_config.static_forward_context
    for name in names:
        layer = layers[name]
        builder = layer.get_attn_backend().get_builder_cls()
        support = builder.get_cudagraph_support(attn_config, layer.get_kv_cache_spec(attn_config))
        if support.value < AttentionCGSupport.UNIFORM_BATCH.value:
            return None
    return DFlashCudaGraphManager(
        config, speculator.device, CUDAGraphMode.FULL_DECODE_ONLY, decode_query_len=int(per_req)
    )


@contextlib.contextmanager
def _without_graphed_draft_block(runner: Any) -> Iterator[int]:
    """The profile pass without the drafter's block routine when serving never runs it eagerly;
    yields the request count its FULL graphs cover (0: nothing changed).

    vLLM's profile run drafts eagerly for max_num_seqs requests: DSpark's lm_head over all K
    positions (requests x K x vocabulary), then each step's Markov bias and logits (136 MB of
    reservation at 64 requests, K = 7, a 151,936-token vocabulary). Serving replays those in
    the FULL graphs, whose pool the graph-pool term already holds, so counting them again in the
    activation headroom over-reserves. The eager work serving does keep (the target's forward,
    the hidden states stored and the context K/V projected before the replay) stays in the pass.
    """
    speculator: Any = getattr(runner, "speculator", None)
    try:
        covered = draft_block_graphed_up_to(speculator) if speculator is not None else 0
    except Exception:  # an unexpected manager: keep the block in the pass rather than lose it
        covered = 0
    if not covered:
        yield 0
        return
    had_own = "_generate_draft" in vars(speculator)
    own = vars(speculator).get("_generate_draft")
    speculator._generate_draft = lambda *args, **kwargs: None
    try:
        yield covered
    finally:
        if had_own:
            speculator._generate_draft = own
        else:
            del speculator._generate_draft
