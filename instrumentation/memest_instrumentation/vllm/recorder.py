"""Optional allocator history (memest_instrumentation.torch.Recorder) for the trigger table.

Without it the report still has phase readings and per-stage pool growth measured by
reservation at stage edges; the trigger table, owners and the per-allocation retained view need
the recorded history.
"""

from __future__ import annotations

from typing import Any

from memest.schema import Breakdown
from memest_instrumentation.vllm.state import state


def ensure_started(where: str) -> None:
    """Start the history at ``where`` ("init", "graph_profiling" or "capture") if due and not on.

    Off by default (MEMEST_HISTORY_FROM=off) unless MEMEST_KEEP_SNAPSHOT=1 asks for the history.
    With MEMEST_HISTORY_FROM=graph_profiling the history starts at graph-memory profiling, or at
    the real capture when a given KV size made vLLM skip profiling.
    """
    st = state()
    if st.recorder is not None or st.history_tried or st.shedding:
        return
    if st.settings.history_from == "off" and not st.settings.keep_snapshot:
        return
    if where == "init" and st.settings.history_from != "init":
        return
    st.history_tried = True
    start()


def start() -> None:
    """Start recording allocator history when the recorder exists and history is wanted."""
    st = state()
    if st.settings.history_max_entries <= 0:
        st.notes.append("allocator history off (MEMEST_HISTORY_MAX_ENTRIES=0)")
        return
    try:
        from memest_instrumentation.torch import Recorder
    except ImportError as exc:
        st.notes.append(f"allocator history unavailable ({exc}); stage growth from pool readings")
        return
    rec = Recorder(
        history=True,
        max_entries=st.settings.history_max_entries,
        stacks="python",
        scrub_paths=True,
    )
    rec.start()
    st.recorder = rec


def _keep(snapshot: Any) -> None:
    """Write the history beside the report (MEMEST_KEEP_SNAPSHOT=1); a failure is a note."""
    st = state()
    from pathlib import Path

    from memest.snapshot import dump_snapshot

    path = Path(st.settings.output_dir) / (st.run_id or "run") / f"snapshot.rank{st.rank}.json.gz"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        dump_snapshot(snapshot, path)
        st.notes.append(f"allocator history kept at {path}")
    except OSError as exc:
        st.notes.append(f"allocator history not kept ({exc})")


def analyze_history() -> Breakdown | None:
    """Stop the recorder and analyze its snapshot into a breakdown (None without a recorder)."""
    st = state()
    rec: Any = st.recorder
    if rec is None:
        return None
    st.recorder = None
    snapshot = rec.snapshot()
    phases = rec.phases
    rec.stop()
    if st.compiled_code is not None:
        snapshot["compiled_code"] = st.compiled_code.model_dump(mode="json", exclude_none=True)
    if st.settings.keep_snapshot:
        _keep(snapshot)
    for warning in getattr(rec, "warnings", []) or []:
        st.notes.append(f"recorder: {warning}")
    from memest.analysis import OwnerRules, analyze

    rules = (
        OwnerRules.from_file(st.settings.rules_file)
        if st.settings.rules_file
        else OwnerRules.default()
    )
    from memest_instrumentation.vllm import measure

    props = measure.gpu_properties()  # the indexer logits' dtype follows the GPU's
    breakdown: Breakdown = analyze(
        snapshot,
        phases,
        rules.with_compiled(st.compiled_code),
        compute_capability=props[2] if props else None,
    )
    return breakdown
