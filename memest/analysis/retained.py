"""The retained view: allocations made under a stage and still live at the end of the history,
with the role of the CUDA stream each was made on (what a start that skips the phase keeps).

A stream only one phase allocated on (the one each of vLLM 0.33.0's ``graph_capture()`` calls
creates: ``distributed/parallel_state.py``, ``torch.cuda.Stream()``) is gone with the phase; a
stream later phases allocate on too outlives it (``utils/torch_utils.py``'s ``aux_stream()``,
the one process-wide auxiliary stream the MoE shared experts run on). What a phase left on a
stream that outlives it, a start that skips the phase allocates later on the same stream.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from memest.schema.breakdown import RetainedRow

if TYPE_CHECKING:
    from memest.analysis.replay import _Replay

StreamRole = Literal["pass", "side", "default"]


def stream_phases(
    columns: tuple[Iterable[int], Iterable[int], Iterable[int]],
    allocs: set[int],
    tag_phase: Sequence[str],
    streams: set[int],
) -> dict[int, set[str]]:
    """The phases that made allocations on each of ``streams`` (stream 0 left out), from the
    history's action, stream and tag columns, the action ids of an allocation and each tag's
    phase (frees are left out: a stream's blocks are freed after the phase that made them)."""
    wanted, phases = streams - {0}, defaultdict[int, set[str]](set)
    if wanted:
        for action, stream, tag in zip(*columns, strict=True):
            if stream in wanted and action in allocs:
                phases[stream].add(tag_phase[tag])
    return phases


def stream_role(stream: int, phase: str, phases: dict[int, set[str]]) -> StreamRole:
    """'default' for stream 0; 'side' when another phase allocated on the stream too; else
    'pass', a stream of that phase alone."""
    if stream == 0:
        return "default"
    return "side" if phases.get(stream, set()) - {phase} else "pass"


def retained_rows(
    replay: _Replay,
    position: dict[int, int],
    history: tuple[dict[str, Any], Sequence[int], set[int]],
    no_stage: str,
) -> list[RetainedRow]:
    """Allocations made under a stage and still live at the last event, by capture size and
    stream role. ``history``: the events, their tag column and the action ids of an allocation;
    events under ``no_stage`` are left out."""
    ev, tag_col, allocs = history
    tables, live = replay.tables, list(replay.tally.live.values())
    tag_phase = [tables.ctx_list[c][0] for c in tables.tag_ctx]
    cols = (ev["action"], ev["stream"], tag_col)
    phases = stream_phases(cols, allocs, tag_phase, {ev["stream"][i] for i in live})
    ret: dict[tuple[int, int, int | None, StreamRole], list[int]] = {}
    for i in live:
        ltag = tag_col[i]
        ctx, own = tables.tag_ctx[ltag], replay.owners.of(ev["stack"][i])
        phase, stage = tables.ctx_list[ctx]
        if stage == no_stage:
            continue
        role = stream_role(ev["stream"][i], phase, phases)
        rrow = ret.setdefault((ctx, own, tables.tag_size[ltag], role), [0, 0])
        rrow[0] += ev["size"][i]
        rrow[1] += 1
    order = sorted(ret.items(), key=lambda kv: (position.get(kv[0][0], 0), kv[0][1], kv[0][2] or 0))
    return [
        RetainedRow.model_construct(
            phase=tables.ctx_list[ctx][0],
            stage=tables.ctx_list[ctx][1],
            owner=replay.owners.names[own],
            capture_size=cs,
            bytes=v[0],
            count=v[1],
            stream=role,
        )
        for (ctx, own, cs, role), v in order
    ]
