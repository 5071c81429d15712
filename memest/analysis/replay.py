"""Replay allocator events into the stage / owner breakdown (pure Python, no torch).

Every allocator event carries a stage tag (see memest.snapshot.tags). The replay walks events in
order, so the pool of each segment is known when it is created (torch 2.11 records no pool per
event; a segment address is reused across pools within one trace) and each segment_free finds
the segment it releases.

Accounting:
- pool growth of a stage: segment_alloc + segment_map bytes on private (graph) pools;
- trigger: the whole segment is charged to the request that made the allocator reserve it
  (the segment event's own frames), so trigger rows sum exactly to the stage's growth;
- live peak: alloc / free replay per (phase, stage, owner);
- retained: allocations made under a stage that are still live at the last event;
- default-pool growth under a stage tag (eager warm-up before a capture) is other PyTorch.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from memest.analysis.owners import (
    INDEXER_LOGITS_BF16,
    INDEXER_LOGITS_FP32_KERNEL,
    UNATTRIBUTED,
    OwnerRules,
    indexer_kernel_output_is_fp32,
)
from memest.analysis.phase_split import phase_splits
from memest.analysis.retained import retained_rows
from memest.errors import InvariantError, SnapshotFormatError, first_error
from memest.schema.breakdown import (
    Breakdown,
    LivePeak,
    PhaseRecord,
    PoolRow,
    RetainedRow,
    StageGrowth,
    TriggerRow,
    UnattributedRow,
)
from memest.schema.report import CompiledCode
from memest.snapshot.format import Snapshot, validate
from memest.snapshot.tags import DEFAULT_POOL, StageTag, parse_tag

NO_STAGE = "(none)"
_ALLOC, _FREE_REQ, _FREE_DONE, _SEG_ALLOC, _SEG_FREE, _OTHER = range(6)
_KINDS = {
    "alloc": _ALLOC,
    "free_requested": _FREE_REQ,
    "free_completed": _FREE_DONE,
    "segment_alloc": _SEG_ALLOC,
    "segment_map": _SEG_ALLOC,
    "segment_free": _SEG_FREE,
    "segment_unmap": _SEG_FREE,
}

Ctx = tuple[str, str]  # (phase, stage)


class _Owners:
    """Owner of each interned stack, computed once per stack."""

    def __init__(self, snapshot: Snapshot, rules: OwnerRules) -> None:
        self.frames = snapshot["frames"]
        self.stacks = snapshot["stacks"]
        self.rules = rules
        self.cache: dict[int, tuple[str, str]] = {}
        self.frame_cache: dict[int, tuple[str | None, bool, bool]] = {}

    def get(self, stack: int) -> tuple[str, str]:
        hit = self.cache.get(stack)
        if hit is None:
            indices = self.stacks[stack] if stack >= 0 else []
            hit = self.rules.classify_indexed(self.frames, indices, self.frame_cache)
            self.cache[stack] = hit
        return hit


def _window_tags(snap: Snapshot, tags: list[StageTag], tag_col: Sequence[int]) -> Sequence[int]:
    """Tag column with untagged events given the tag of the innermost window around them."""
    windows = [
        w
        for w in snap.get("windows", [])
        if isinstance(w, dict) and w.get("tag") and w.get("start_us") is not None
    ]
    if not windows or 0 not in tag_col:
        return tag_col  # read only: no copy of a column the size of the history
    windows.sort(key=lambda w: int(w["start_us"]))
    starts = [int(w["start_us"]) for w in windows]
    win_tag: list[int] = []
    for w in windows:
        win_tag.append(len(tags))
        tags.append(parse_tag(str(w["tag"])))
    far = 1 << 62
    ends = [int(w["end_us"]) if w.get("end_us") is not None else far for w in windows]
    times = snap["events"]["time_us"]
    out = array("i", tag_col)  # a compact copy, wide enough for the window tags added above
    for i, t in enumerate(tag_col):
        if t:
            continue
        j = bisect.bisect_right(starts, times[i]) - 1
        while j >= 0:
            if ends[j] >= times[i]:
                out[i] = win_tag[j]
                break
            j -= 1
    return out


@dataclass
class _TagTables:
    """Per interned tag: its (phase, stage) context, graph pool and capture size."""

    ctx_index: dict[Ctx, int]
    ctx_list: list[Ctx]
    tag_ctx: list[int]
    tag_pool: list[str | None]
    tag_size: list[int | None]

    @classmethod
    def build(cls, snap: Snapshot, tags: list[StageTag]) -> _TagTables:
        ctx_index: dict[Ctx, int] = {}
        ctx_list: list[Ctx] = []
        tag_ctx: list[int] = []
        for t in tags:
            ckey = (t.phase, t.stage or NO_STAGE)
            if ckey not in ctx_index:
                ctx_index[ckey] = len(ctx_list)
                ctx_list.append(ckey)
            tag_ctx.append(ctx_index[ckey])
        window_pool: dict[int, str] = {}
        for w in snap.get("windows", []):
            if isinstance(w, dict) and w.get("window") is not None and w.get("pool"):
                window_pool[int(w["window"])] = str(w["pool"])
        return cls(
            ctx_index=ctx_index,
            ctx_list=ctx_list,
            tag_ctx=tag_ctx,
            tag_pool=[_tag_pool(t, window_pool) for t in tags],
            tag_size=[t.capture_size for t in tags],
        )


class _OwnerIndex:
    """Owner names interned to small ints, one classification per stack."""

    def __init__(self, owners: _Owners) -> None:
        self.owners = owners
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.by_stack: dict[int, int] = {}

    def of(self, stack: int) -> int:
        idx = self.by_stack.get(stack)
        if idx is None:
            name = self.owners.get(stack)[0]
            idx = self.index.get(name)
            if idx is None:
                idx = len(self.names)
                self.index[name] = idx
                self.names.append(name)
            self.by_stack[stack] = idx
        return idx


@dataclass
class _Tally:
    """What the replay accumulates; live tensors are keyed by (ctx, owner) = ctx * base + owner."""

    base: int
    live: dict[int, int] = field(default_factory=dict)  # addr -> index of its alloc event
    peak: dict[int, int] = field(default_factory=dict)
    seg_live: dict[int, tuple[str, int]] = field(default_factory=dict)
    stage_growth: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    stage_segments: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    stage_released: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    stage_default: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    stage_pools: defaultdict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    phase_private_net: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    trig_bytes: defaultdict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    trig_count: defaultdict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    trig_req: defaultdict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    trig_stack: dict[tuple[int, int], int] = field(default_factory=dict)
    unattr: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    pool_growth: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    pool_released: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    pending: dict[int, tuple[tuple[int, int], int, int]] = field(default_factory=dict)
    stage_order: list[int] = field(default_factory=list)
    seen_stage: set[int] = field(default_factory=set)
    unknown_free_segments: int = 0

    def first_seen(self, ctx: int) -> None:
        if ctx not in self.seen_stage:
            self.seen_stage.add(ctx)
            self.stage_order.append(ctx)


@dataclass
class _Replay:
    """One pass over the events (the hot loop) and the rare segment events it delegates."""

    tables: _TagTables
    owners: _OwnerIndex
    pools_table: list[str]
    tally: _Tally

    def segment_alloc(
        self, addr: int, size: int, stream: int, tag: int, stack: int, pidx: int
    ) -> None:
        t, tables = self.tally, self.tables
        ctx = tables.tag_ctx[tag]
        pool = self.pools_table[pidx] if pidx >= 0 else tables.tag_pool[tag] or DEFAULT_POOL
        t.seg_live[addr] = (pool, size)
        t.pool_growth[pool] += size
        t.first_seen(ctx)
        if pool == DEFAULT_POOL:
            t.stage_default[ctx] += size
            return
        own = self.owners.of(stack)
        tkey = (ctx, own)
        t.stage_growth[ctx] += size
        t.stage_segments[ctx] += 1
        t.stage_pools[ctx].add(pool)
        t.phase_private_net[tables.ctx_list[ctx][0]] += size
        t.trig_bytes[tkey] += size
        t.trig_count[tkey] += 1
        t.trig_stack.setdefault(tkey, stack)
        t.pending[stream] = (tkey, addr, addr + size)
        if self.owners.names[own].startswith(UNATTRIBUTED):
            top = self.owners.owners.get(stack)[1]
            urow = t.unattr.setdefault((ctx, top), [0, 0])
            urow[0] += size
            urow[1] += 1

    def segment_free(self, addr: int, size: int, tag: int, pidx: int) -> None:
        t, tables = self.tally, self.tables
        ctx = tables.tag_ctx[tag]
        known = t.seg_live.pop(addr, None)
        if known is not None:
            pool = known[0]
        elif pidx >= 0:
            pool = self.pools_table[pidx]
        else:
            t.unknown_free_segments += 1
            pool = tables.tag_pool[tag] or DEFAULT_POOL
        t.pool_released[pool] += size
        if pool != DEFAULT_POOL:
            t.stage_released[ctx] += size
            t.phase_private_net[tables.ctx_list[ctx][0]] -= size

    def run(
        self,
        ev: dict[str, Any],
        kinds: list[int],
        free_kind: int,
        tag_col: Sequence[int],
        pool_col: Iterable[int],
    ) -> None:
        # Allocations and frees are most of the events: they stay inline, with local aliases.
        t = self.tally
        base, tag_ctx, live, peak, pending = t.base, self.tables.tag_ctx, t.live, t.peak, t.pending
        stack_owner = [-1] * (base - 1)  # index stack + 1 (stack -1 = none)
        cur: dict[int, int] = {}
        cur_get, peak_get, owner_of = cur.get, peak.get, self.owners.of
        sizes, stacks = ev["size"], ev["stack"]
        cols = (ev["action"], ev["addr"], sizes, ev["stream"], tag_col, stacks, pool_col)
        events = zip(itertools.count(), *cols, strict=False)
        for i, a, addr, size, stream, tag, stack, pidx in events:
            kind = kinds[a]
            if kind == _ALLOC:
                own = stack_owner[stack + 1]
                if own < 0:
                    own = stack_owner[stack + 1] = owner_of(stack)
                key = tag_ctx[tag] * base + own
                live[addr] = i  # an int, not a tuple: size, tag and owner are read back from i
                c = cur_get(key, 0) + size
                cur[key] = c
                if c > peak_get(key, 0):
                    peak[key] = c
                if pending and (p := pending.pop(stream, None)) is not None and p[1] <= addr < p[2]:
                    t.trig_req[p[0]] += size
            elif kind == free_kind:
                j = live.pop(addr, None)
                if j is not None:
                    cur[tag_ctx[tag_col[j]] * base + stack_owner[stacks[j] + 1]] -= sizes[j]
            elif kind == _SEG_ALLOC:
                self.segment_alloc(addr, size, stream, tag, stack, pidx)
            elif kind == _SEG_FREE:
                self.segment_free(addr, size, tag, pidx)


def analyze(
    snapshot: Snapshot,
    phases: Sequence[PhaseRecord] | None = None,
    rules: OwnerRules | None = None,
    *,
    compute_capability: str | None = None,
) -> Breakdown:
    """Build the stage / owner breakdown of one snapshot.

    Args:
        snapshot: memest's snapshot form (memest.snapshot.load_snapshot / Recorder.snapshot()).
        phases: phase-edge readings; default the snapshot's own "phases" list.
        rules: owner rules; default OwnerRules.default() (vLLM 0.33.0).
        compute_capability: the GPU's ("9.0", "10.0"), which decides the DSA indexer kernel's
            output dtype in a stage without vLLM's FP32 copy (owners.indexer_kernel_output_is_fp32).

    Returns:
        The Breakdown (phase split, stage growth, triggers, live peaks, retained, unattributed).

    Raises:
        SnapshotFormatError: the snapshot is malformed.
        InvariantError: trigger rows do not sum to their stage's pool growth.
    """
    snap = validate(snapshot)
    if phases is None:
        phases = [PhaseRecord.model_validate(p) for p in snap.get("phases", [])]
    ev = snap["events"]
    n_events = len(ev["action"])
    tags = [parse_tag(t) for t in snap["tags"]]
    tag_col = _window_tags(snap, tags, ev["tag"])
    tables = _TagTables.build(snap, tags)
    owners = _Owners(snap, _with_compiled_code(snap, rules or OwnerRules.default()))
    replay = _Replay(
        tables, _OwnerIndex(owners), snap.get("pools", []), _Tally(base=len(snap["stacks"]) + 2)
    )
    free_kind = _FREE_DONE if "free_completed" in snap["actions"] else _FREE_REQ
    kinds = [_KINDS.get(a, _OTHER) for a in snap["actions"]]
    pool_col = ev.get("pool") or itertools.repeat(-1, n_events)  # not a list per event
    replay.run(ev, kinds, free_kind, tag_col, pool_col)
    stages, position = _stage_rows(snap, replay)
    triggers = _trigger_rows(replay, position)
    total_private_growth = _check_identity(stages, triggers, replay.tally)
    allocs = {k for k, kind in enumerate(kinds) if kind == _ALLOC}
    retained = retained_rows(replay, position, (ev, tag_col, allocs), NO_STAGE)
    live_peaks = _live_peaks(replay)
    _label_indexer_dtype(triggers, live_peaks, retained, compute_capability)
    warnings = _warnings(snap, tags, n_events, replay.tally)
    return Breakdown(
        phases=phase_splits(phases, replay.tally.phase_private_net, warnings),
        stages=stages,
        triggers=triggers,
        live_peaks=live_peaks,
        retained=retained,
        unattributed=_unattributed_rows(replay, retained),
        graph_pool_growth_bytes=total_private_growth,
        event_count=n_events,
        pools=_pool_rows(snap, replay.tally),
        warnings=warnings,
    )


def _label_indexer_dtype(
    triggers: list[TriggerRow],
    live_peaks: list[LivePeak],
    retained: list[RetainedRow],
    compute_capability: str | None,
) -> None:
    """Name the indexer kernel's output by its dtype, stage by stage (in place)."""
    rows: list[TriggerRow | LivePeak | RetainedRow] = [*triggers, *live_peaks, *retained]
    owners_by_stage: defaultdict[Ctx, set[str]] = defaultdict(set)
    for row in rows:
        owners_by_stage[(row.phase, row.stage)].add(row.owner)
    for row in rows:
        if row.owner == INDEXER_LOGITS_BF16 and indexer_kernel_output_is_fp32(
            owners_by_stage[(row.phase, row.stage)], compute_capability
        ):
            row.owner = INDEXER_LOGITS_FP32_KERNEL


def _with_compiled_code(snap: Snapshot, rules: OwnerRules) -> OwnerRules:
    """The rules with the snapshot's map of generated code, unless they already carry one."""
    data = snap.get("compiled_code")
    if rules.compiled or not data:
        return rules
    try:
        return rules.with_compiled(CompiledCode.model_validate(data))
    except ValidationError as exc:
        where, message, _ = first_error(exc)
        raise SnapshotFormatError(f"snapshot.compiled_code.{where}: {message}") from None


def _stage_rows(snap: Snapshot, replay: _Replay) -> tuple[list[StageGrowth], dict[int, int]]:
    """Stage rows in first-seen order (capture windows give graph counts and sizes)."""
    t, tables = replay.tally, replay.tables
    stage_sizes: dict[int, set[int]] = defaultdict(set)
    for t_idx, t_size in enumerate(tables.tag_size):
        if t_size is not None:
            stage_sizes[tables.tag_ctx[t_idx]].add(t_size)
    win_count: dict[Ctx, int] = defaultdict(int)
    for w in snap.get("windows", []):
        if isinstance(w, dict) and w.get("kind", "capture") == "capture" and w.get("tag"):
            tag = parse_tag(str(w["tag"]))
            wkey = (tag.phase, tag.stage or NO_STAGE)
            win_count[wkey] += 1
            if wkey in tables.ctx_index:
                if tag.capture_size is not None:
                    stage_sizes[tables.ctx_index[wkey]].add(tag.capture_size)
                t.first_seen(tables.ctx_index[wkey])
    stages: list[StageGrowth] = []
    for ctx in t.stage_order:
        phase, stage = tables.ctx_list[ctx]
        moved = t.stage_growth[ctx] or t.stage_released[ctx] or t.stage_default[ctx]
        if not moved and stage == NO_STAGE:
            continue
        sizes = sorted(stage_sizes.get(ctx, ()))
        stages.append(
            StageGrowth(
                stage=stage,
                phase=phase,
                pool_growth_bytes=t.stage_growth[ctx],
                segments=t.stage_segments[ctx],
                graph_count=win_count.get(tables.ctx_list[ctx]) if win_count else None,
                widest=str(sizes[-1]) if sizes else None,
                pool_released_bytes=t.stage_released[ctx],
                default_pool_growth_bytes=t.stage_default[ctx],
                pools=sorted(t.stage_pools.get(ctx, ())),
                capture_sizes=sizes,
            )
        )
    return stages, {ctx: i for i, ctx in enumerate(t.stage_order)}


def _trigger_rows(replay: _Replay, position: dict[int, int]) -> list[TriggerRow]:
    t, ctx_list, owners = replay.tally, replay.tables.ctx_list, replay.owners
    rows: list[TriggerRow] = []
    order = sorted(t.trig_bytes.items(), key=lambda kv: (position.get(kv[0][0], 0), -kv[1]))
    for (ctx, own), nbytes in order:
        phase, stage = ctx_list[ctx]
        rows.append(
            TriggerRow.model_construct(
                stage=stage,
                phase=phase,
                owner=owners.names[own],
                bytes=nbytes,
                count=t.trig_count[(ctx, own)],
                top_frame=owners.owners.get(t.trig_stack[(ctx, own)])[1],
                requested_bytes=t.trig_req.get((ctx, own), 0),
            )
        )
    return rows


def _check_identity(stages: list[StageGrowth], triggers: list[TriggerRow], t: _Tally) -> int:
    """Every byte of private-pool growth is charged to exactly one trigger row; the total."""
    charged: dict[Ctx, int] = defaultdict(int)
    for trow in triggers:
        charged[(trow.phase, trow.stage)] += trow.bytes
    for st in stages:
        if charged.get((st.phase, st.stage), 0) != st.pool_growth_bytes:
            raise InvariantError(
                f"stage {st.phase}/{st.stage}: trigger rows sum to "
                f"{charged.get((st.phase, st.stage), 0)} bytes, pool growth is "
                f"{st.pool_growth_bytes} bytes"
            )
    total = sum(st.pool_growth_bytes for st in stages)
    if total != sum(v for p, v in t.pool_growth.items() if p != DEFAULT_POOL):
        raise InvariantError("stage pool growth does not sum to the private pools' growth")
    return total


def _live_peaks(replay: _Replay) -> list[LivePeak]:
    base, ctx_list, names = replay.tally.base, replay.tables.ctx_list, replay.owners.names
    peaks = sorted(
        ((divmod(k, base), v) for k, v in replay.tally.peak.items()),
        key=lambda kv: (kv[0][0], -kv[1]),
    )
    return [
        LivePeak.model_construct(
            phase=ctx_list[ctx][0], stage=ctx_list[ctx][1], owner=names[own], peak_bytes=value
        )
        for (ctx, own), value in peaks
        if value > 0
    ]


def _unattributed_rows(replay: _Replay, retained: list[RetainedRow]) -> list[UnattributedRow]:
    ctx_index, ctx_list = replay.tables.ctx_index, replay.tables.ctx_list
    ret_unattr: dict[tuple[int, str], list[int]] = {}
    for r in retained:
        if r.owner.startswith(UNATTRIBUTED):
            top = r.owner.split(":", 1)[1]
            row = ret_unattr.setdefault((ctx_index[(r.phase, r.stage)], top), [0, 0])
            row[0] += r.bytes
            row[1] += r.count
    by_view: tuple[tuple[Literal["trigger", "retained"], dict[tuple[int, str], list[int]]], ...] = (
        ("trigger", replay.tally.unattr),
        ("retained", ret_unattr),
    )
    return [
        UnattributedRow.model_construct(
            phase=ctx_list[ctx][0],
            stage=ctx_list[ctx][1],
            top_frame=top,
            bytes=v[0],
            count=v[1],
            view=view,
        )
        for view, rows in by_view
        for (ctx, top), v in sorted(rows.items(), key=lambda kv: -kv[1][0])
    ]


def _pool_rows(snap: Snapshot, t: _Tally) -> list[PoolRow]:
    end_reserved: dict[str, int] = defaultdict(int)
    for seg in snap["segments"]:
        end_reserved[str(seg["pool"])] += int(seg["total_size"])
    return [
        PoolRow(
            pool=p,
            private=p != DEFAULT_POOL,
            growth_bytes=t.pool_growth.get(p, 0),
            released_bytes=t.pool_released.get(p, 0),
            reserved_end_bytes=end_reserved.get(p, 0),
        )
        for p in sorted(set(t.pool_growth) | set(t.pool_released) | set(end_reserved))
    ]


def _warnings(snap: Snapshot, tags: list[StageTag], n_events: int, t: _Tally) -> list[str]:
    warnings: list[str] = []
    source = snap.get("source", {})
    max_entries = source.get("max_entries") if isinstance(source, dict) else None
    if isinstance(max_entries, int) and n_events >= max_entries:
        warnings.append(
            f"history holds {n_events} events = max_entries: the earliest events were "
            "overwritten, so growth before them is missing"
        )
    if t.unknown_free_segments:
        warnings.append(
            f"{t.unknown_free_segments} segment frees of segments created before the history "
            "began (pool taken from the tag)"
        )
    if n_events and not any(tag.phase or tag.stage for tag in tags):
        warnings.append("no event carries a stage tag: stages cannot be separated")
    return warnings


def _tag_pool(tag: StageTag, window_pool: dict[int, str]) -> str | None:
    """Pool of events under ``tag``: named in the tag, learnt at the window's end, or unknown."""
    if tag.pool:
        return tag.pool
    if tag.window is not None:
        return window_pool.get(tag.window, f"capture#{tag.window}")
    return None


def summarize_owners(breakdown: Breakdown) -> dict[str, Any]:
    """Totals per owner over all stages: trigger bytes, retained bytes, largest live peak."""
    out: dict[str, dict[str, int]] = {}
    for t in breakdown.triggers:
        out.setdefault(t.owner, {"trigger_bytes": 0, "retained_bytes": 0, "peak_bytes": 0})
        out[t.owner]["trigger_bytes"] += t.bytes
    for r in breakdown.retained:
        out.setdefault(r.owner, {"trigger_bytes": 0, "retained_bytes": 0, "peak_bytes": 0})
        out[r.owner]["retained_bytes"] += r.bytes
    for p in breakdown.live_peaks:
        out.setdefault(p.owner, {"trigger_bytes": 0, "retained_bytes": 0, "peak_bytes": 0})
        out[p.owner]["peak_bytes"] = max(out[p.owner]["peak_bytes"], p.peak_bytes)
    return dict(out)
