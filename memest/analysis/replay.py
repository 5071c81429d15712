"""Replay allocator events into the stage / owner breakdown (pure Python, no torch).

Every allocator event carries a stage tag (see memest.analysis.tags). The replay walks events in
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
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Literal

from memest.analysis.owners import UNATTRIBUTED, OwnerRules
from memest.analysis.tags import DEFAULT_POOL, StageTag, parse_tag
from memest.errors import InvariantError
from memest.schema.breakdown import (
    Breakdown,
    LivePeak,
    PhaseRecord,
    PhaseSplit,
    PoolRow,
    RetainedRow,
    StageGrowth,
    TriggerRow,
    UnattributedRow,
)
from memest.snapshot.format import Snapshot, validate

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
        self.frame_cache: dict[int, tuple[str | None, bool]] = {}

    def get(self, stack: int) -> tuple[str, str]:
        hit = self.cache.get(stack)
        if hit is None:
            indices = self.stacks[stack] if stack >= 0 else []
            hit = self.rules.classify_indexed(self.frames, indices, self.frame_cache)
            self.cache[stack] = hit
        return hit


def _window_tags(snapshot: Snapshot, tags: list[StageTag], tag_col: Sequence[int]) -> list[int]:
    """Tag column with untagged events given the tag of the innermost window around them."""
    windows = [
        w
        for w in snapshot.get("windows", [])
        if isinstance(w, dict) and w.get("tag") and w.get("start_us") is not None
    ]
    if not windows or 0 not in tag_col:
        return list(tag_col)
    windows.sort(key=lambda w: int(w["start_us"]))
    starts = [int(w["start_us"]) for w in windows]
    win_tag: list[int] = []
    for w in windows:
        win_tag.append(len(tags))
        tags.append(parse_tag(str(w["tag"])))
    far = 1 << 62
    ends = [int(w["end_us"]) if w.get("end_us") is not None else far for w in windows]
    times = snapshot["events"]["time_us"]
    out = list(tag_col)
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


def analyze(
    snapshot: Snapshot,
    phases: Sequence[PhaseRecord] | None = None,
    rules: OwnerRules | None = None,
) -> Breakdown:
    """Build the stage / owner breakdown of one snapshot.

    Args:
        snapshot: memest's snapshot form (memest.snapshot.load_snapshot / Recorder.snapshot()).
        phases: phase-edge readings; default the snapshot's own "phases" list.
        rules: owner rules; default OwnerRules.default() (vLLM 0.33.0).

    Returns:
        The Breakdown (phase split, stage growth, triggers, live peaks, retained, unattributed).

    Raises:
        SnapshotFormatError: the snapshot is malformed.
        InvariantError: trigger rows do not sum to their stage's pool growth.
    """
    snap = validate(snapshot)
    rules = rules or OwnerRules.default()
    if phases is None:
        phases = [PhaseRecord.model_validate(p) for p in snap.get("phases", [])]
    warnings: list[str] = []
    ev = snap["events"]
    n_events = len(ev["action"])
    kinds = [_KINDS.get(a, _OTHER) for a in snap["actions"]]
    tags = [parse_tag(t) for t in snap["tags"]]
    tag_col = _window_tags(snap, tags, ev["tag"])
    if "free_completed" in snap["actions"]:
        free_kind = _FREE_DONE
    else:
        free_kind = _FREE_REQ
    pools_table: list[str] = snap.get("pools", [])
    pool_col: Sequence[int] = ev.get("pool") or [-1] * n_events

    # Per tag: context index (phase, stage), pool and capture size.
    ctx_index: dict[Ctx, int] = {}
    ctx_list: list[Ctx] = []
    tag_ctx: list[int] = []
    for t in tags:
        ckey = (t.phase, t.stage or NO_STAGE)
        idx = ctx_index.get(ckey)
        if idx is None:
            idx = len(ctx_list)
            ctx_index[ckey] = idx
            ctx_list.append(ckey)
        tag_ctx.append(idx)
    window_pool: dict[int, str] = {}
    for w in snap.get("windows", []):
        if isinstance(w, dict) and w.get("window") is not None and w.get("pool"):
            window_pool[int(w["window"])] = str(w["pool"])
    tag_pool = [_tag_pool(t, window_pool) for t in tags]
    tag_size = [t.capture_size for t in tags]

    owners = _Owners(snap, rules)
    owner_index: dict[str, int] = {}
    owner_list: list[str] = []
    stack_owner: dict[int, int] = {}

    def owner_of(stack: int) -> int:
        idx = stack_owner.get(stack)
        if idx is None:
            name = owners.get(stack)[0]
            idx = owner_index.get(name)
            if idx is None:
                idx = len(owner_list)
                owner_index[name] = idx
                owner_list.append(name)
            stack_owner[stack] = idx
        return idx

    # Live-tensor groups are (ctx, owner) packed into one int: key = ctx * base + owner.
    base = len(snap["stacks"]) + 2
    stack_owner_list = [-1] * (len(snap["stacks"]) + 1)  # index stack + 1 (stack -1 = none)
    live: dict[int, tuple[int, int, int]] = {}  # addr -> (size, key, tag)
    cur: dict[int, int] = {}
    peak: dict[int, int] = {}
    cur_get, peak_get = cur.get, peak.get
    seg_live: dict[int, tuple[str, int]] = {}
    stage_growth: dict[int, int] = defaultdict(int)
    stage_segments: dict[int, int] = defaultdict(int)
    stage_released: dict[int, int] = defaultdict(int)
    stage_default: dict[int, int] = defaultdict(int)
    stage_pools: dict[int, set[str]] = defaultdict(set)
    stage_sizes: dict[int, set[int]] = defaultdict(set)
    phase_private_net: dict[str, int] = defaultdict(int)
    trig_bytes: dict[tuple[int, int], int] = defaultdict(int)
    trig_count: dict[tuple[int, int], int] = defaultdict(int)
    trig_req: dict[tuple[int, int], int] = defaultdict(int)
    trig_stack: dict[tuple[int, int], int] = {}
    unattr: dict[tuple[int, str], list[int]] = {}
    pool_growth: dict[str, int] = defaultdict(int)
    pool_released: dict[str, int] = defaultdict(int)
    pending: dict[int, tuple[tuple[int, int], int, int]] = {}
    stage_order: list[int] = []
    seen_stage: set[int] = set()
    unknown_free_segments = 0

    for a, addr, size, stream, tag, stack, pidx in zip(
        ev["action"],
        ev["addr"],
        ev["size"],
        ev["stream"],
        tag_col,
        ev["stack"],
        pool_col,
        strict=False,
    ):
        kind = kinds[a]
        if kind == _ALLOC:
            own = stack_owner_list[stack + 1]
            if own < 0:
                own = owner_of(stack)
                stack_owner_list[stack + 1] = own
            key = tag_ctx[tag] * base + own
            live[addr] = (size, key, tag)
            c = cur_get(key, 0) + size
            cur[key] = c
            if c > peak_get(key, 0):
                peak[key] = c
            if pending:
                p = pending.get(stream)
                if p is not None:
                    if p[1] <= addr < p[2]:
                        trig_req[p[0]] += size
                    del pending[stream]
        elif kind == free_kind:
            entry = live.pop(addr, None)
            if entry is not None:
                cur[entry[1]] -= entry[0]
        elif kind == _SEG_ALLOC:
            ctx = tag_ctx[tag]
            if pidx >= 0:
                pool = pools_table[pidx]
            else:
                pool = tag_pool[tag] or DEFAULT_POOL
            seg_live[addr] = (pool, size)
            pool_growth[pool] += size
            if ctx not in seen_stage:
                seen_stage.add(ctx)
                stage_order.append(ctx)
            if pool == DEFAULT_POOL:
                stage_default[ctx] += size
                continue
            own = owner_of(stack)
            tkey = (ctx, own)
            stage_growth[ctx] += size
            stage_segments[ctx] += 1
            stage_pools[ctx].add(pool)
            phase_private_net[ctx_list[ctx][0]] += size
            trig_bytes[tkey] += size
            trig_count[tkey] += 1
            trig_stack.setdefault(tkey, stack)
            pending[stream] = (tkey, addr, addr + size)
            if owner_list[own].startswith(UNATTRIBUTED):
                top = owners.get(stack)[1]
                urow = unattr.setdefault((ctx, top), [0, 0])
                urow[0] += size
                urow[1] += 1
        elif kind == _SEG_FREE:
            ctx = tag_ctx[tag]
            known = seg_live.pop(addr, None)
            if known is not None:
                pool = known[0]
            elif pidx >= 0:
                pool = pools_table[pidx]
            else:
                unknown_free_segments += 1
                pool = tag_pool[tag] or DEFAULT_POOL
            pool_released[pool] += size
            if pool != DEFAULT_POOL:
                stage_released[ctx] += size
                phase_private_net[ctx_list[ctx][0]] -= size

    for t_idx, t_size in enumerate(tag_size):
        if t_size is not None:
            stage_sizes[tag_ctx[t_idx]].add(t_size)
    # Stages: capture windows give graph counts and sizes.
    win_count: dict[Ctx, int] = defaultdict(int)
    for w in snap.get("windows", []):
        if isinstance(w, dict) and w.get("kind", "capture") == "capture" and w.get("tag"):
            t = parse_tag(str(w["tag"]))
            wkey = (t.phase, t.stage or NO_STAGE)
            win_count[wkey] += 1
            if t.capture_size is not None and wkey in ctx_index:
                stage_sizes[ctx_index[wkey]].add(t.capture_size)
            if wkey in ctx_index and ctx_index[wkey] not in seen_stage:
                seen_stage.add(ctx_index[wkey])
                stage_order.append(ctx_index[wkey])
    stages: list[StageGrowth] = []
    for ctx in stage_order:
        phase, stage = ctx_list[ctx]
        if not (
            stage_growth[ctx] or stage_released[ctx] or stage_default[ctx] or stage != NO_STAGE
        ):
            continue
        sizes = sorted(stage_sizes.get(ctx, ()))
        stages.append(
            StageGrowth(
                stage=stage,
                phase=phase,
                pool_growth_bytes=stage_growth[ctx],
                segments=stage_segments[ctx],
                graph_count=win_count.get(ctx_list[ctx]) if win_count else None,
                widest=str(sizes[-1]) if sizes else None,
                pool_released_bytes=stage_released[ctx],
                default_pool_growth_bytes=stage_default[ctx],
                pools=sorted(stage_pools.get(ctx, ())),
                capture_sizes=sizes,
            )
        )
    position = {ctx: i for i, ctx in enumerate(stage_order)}

    triggers: list[TriggerRow] = []
    for (ctx, own), nbytes in sorted(
        trig_bytes.items(), key=lambda kv: (position.get(kv[0][0], 0), -kv[1])
    ):
        phase, stage = ctx_list[ctx]
        triggers.append(
            TriggerRow.model_construct(
                stage=stage,
                phase=phase,
                owner=owner_list[own],
                bytes=nbytes,
                count=trig_count[(ctx, own)],
                top_frame=owners.get(trig_stack[(ctx, own)])[1],
                requested_bytes=trig_req.get((ctx, own), 0),
            )
        )
    # Identity: every byte of private-pool growth is charged to exactly one trigger row.
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
    total_private_growth = sum(st.pool_growth_bytes for st in stages)
    if total_private_growth != sum(v for p, v in pool_growth.items() if p != DEFAULT_POOL):
        raise InvariantError("stage pool growth does not sum to the private pools' growth")

    live_peaks = [
        LivePeak.model_construct(
            phase=ctx_list[ctx][0], stage=ctx_list[ctx][1], owner=owner_list[own], peak_bytes=value
        )
        for (ctx, own), value in sorted(
            ((divmod(k, base), v) for k, v in peak.items()), key=lambda kv: (kv[0][0], -kv[1])
        )
        if value > 0
    ]

    ret: dict[tuple[int, int, int | None], list[int]] = {}
    ret_unattr: dict[tuple[int, str], list[int]] = {}
    for size, lkey, ltag in live.values():
        ctx, own = divmod(lkey, base)
        if ctx_list[ctx][1] == NO_STAGE:
            continue
        rrow = ret.setdefault((ctx, own, tag_size[ltag]), [0, 0])
        rrow[0] += size
        rrow[1] += 1
    retained = [
        RetainedRow.model_construct(
            phase=ctx_list[ctx][0],
            stage=ctx_list[ctx][1],
            owner=owner_list[own],
            capture_size=cs,
            bytes=v[0],
            count=v[1],
        )
        for (ctx, own, cs), v in sorted(
            ret.items(), key=lambda kv: (position.get(kv[0][0], 0), kv[0][1], kv[0][2] or 0)
        )
    ]
    for r in retained:
        if r.owner.startswith(UNATTRIBUTED):
            top = r.owner.split(":", 1)[1]
            row = ret_unattr.setdefault((ctx_index[(r.phase, r.stage)], top), [0, 0])
            row[0] += r.bytes
            row[1] += r.count

    by_view: tuple[tuple[Literal["trigger", "retained"], dict[tuple[int, str], list[int]]], ...] = (
        ("trigger", unattr),
        ("retained", ret_unattr),
    )
    unattributed = [
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

    end_reserved: dict[str, int] = defaultdict(int)
    for seg in snap["segments"]:
        end_reserved[str(seg["pool"])] += int(seg["total_size"])
    pools = [
        PoolRow(
            pool=p,
            private=p != DEFAULT_POOL,
            growth_bytes=pool_growth.get(p, 0),
            released_bytes=pool_released.get(p, 0),
            reserved_end_bytes=end_reserved.get(p, 0),
        )
        for p in sorted(set(pool_growth) | set(pool_released) | set(end_reserved))
    ]

    source = snap.get("source", {})
    max_entries = source.get("max_entries") if isinstance(source, dict) else None
    if isinstance(max_entries, int) and n_events >= max_entries:
        warnings.append(
            f"history holds {n_events} events = max_entries: the earliest events were "
            "overwritten, so growth before them is missing"
        )
    if unknown_free_segments:
        warnings.append(
            f"{unknown_free_segments} segment frees of segments created before the history "
            "began (pool taken from the tag)"
        )
    if n_events and not any(t.phase or t.stage for t in tags):
        warnings.append("no event carries a stage tag: stages cannot be separated")

    phase_rows = _phase_splits(phases, phase_private_net, warnings)
    return Breakdown(
        phases=phase_rows,
        stages=stages,
        triggers=triggers,
        live_peaks=live_peaks,
        retained=retained,
        unattributed=unattributed,
        graph_pool_growth_bytes=total_private_growth,
        event_count=n_events,
        pools=pools,
        warnings=warnings,
    )


def _tag_pool(tag: StageTag, window_pool: dict[int, str]) -> str | None:
    """Pool of events under ``tag``: named in the tag, learnt at the window's end, or unknown."""
    if tag.pool:
        return tag.pool
    if tag.window is not None:
        return window_pool.get(tag.window, f"capture#{tag.window}")
    return None


def _private_pool_delta(start: dict[str, int], end: dict[str, int]) -> int:
    keys = (set(start) | set(end)) - {DEFAULT_POOL}
    return sum(end.get(k, 0) - start.get(k, 0) for k in keys)


def phase_split(phase: PhaseRecord, graph_net_bytes: int = 0) -> tuple[PhaseSplit, str | None]:
    """Added device memory of one phase split into graph pools, other PyTorch and outside it.

    Graph pools come from the pool readings at the phase's edges; without them, from
    ``graph_net_bytes`` (the replayed private-pool growth). Without device readings the total
    is the allocator's reserved growth, and the second value says so.
    """
    s, e = phase.start, phase.end
    reserved = e.torch_reserved_bytes - s.torch_reserved_bytes
    warning = None
    if s.device_used_bytes is not None and e.device_used_bytes is not None:
        total = e.device_used_bytes - s.device_used_bytes
    else:
        total = reserved
        warning = f"phase {phase.name}: no device reading, total = torch reserved growth"
    if s.pool_reserved_bytes or e.pool_reserved_bytes:
        graph = _private_pool_delta(s.pool_reserved_bytes, e.pool_reserved_bytes)
    else:
        graph = graph_net_bytes
    split = PhaseSplit(
        phase=phase.name,
        total_added_bytes=total,
        graph_pool_bytes=graph,
        other_torch_bytes=reserved - graph,
        outside_torch_bytes=total - reserved,
    )
    return split, warning


def _phase_splits(
    phases: Sequence[PhaseRecord], private_net: dict[str, int], warnings: list[str]
) -> list[PhaseSplit]:
    rows: list[PhaseSplit] = []
    for ph in phases:
        split, warning = phase_split(ph, private_net.get(ph.name, 0))
        rows.append(split)
        if warning is not None:
            warnings.append(warning)
    return rows


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
