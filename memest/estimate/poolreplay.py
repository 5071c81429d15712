"""What-if by allocator replay: the capture pool's G request sequence, resized for G', simulated.

A measured snapshot under grid G holds every request the capture made into the graph pool. The
replay cuts that sequence into graphs, builds the sequence grid G' would make, runs it through
memest.estimate.allocsim and charges each simulated segment to the (stage, owner) of the request
that triggered it, as the trigger table does.

Why per graph. On vLLM 0.33.0 (Llama-8B shape, H200) the requests of one graph depend on its
capture size only: the 64-token graph of a 256-token grid and of a 64-token grid make the same 289
requests, each proportional to the size, and every graph frees all it took before the next one
starts. Growth is made of segments, and which segments appear depends on where requests cross the
allocator's thresholds (a 128-token graph still fits a 1 MiB request in the small pool, 136 does
not), so scaling bytes is not faithful (-35 % from the 256-token grid to the 64-token one) and replaying
only the widest graph is not either (-10 % the other way: it misses the small-pool segments the
128-token graph triggers). Scaling the whole G sequence by one factor matched on that data, but it
replays G's number of graphs at G's spacing; the G' sequence is rebuilt graph by graph instead,
from measured graphs wherever G captured the size.

- A G' size that G captured: that graph's requests, unchanged.
- Another size: the requests of the nearest G graph above it (or G's widest), each moved along the
  line through the same request in two G graphs (so a constant request stays constant and a
  proportional one scales); with one G graph, or graphs whose request lists differ, requests of
  scaling owners are scaled by the size ratio. Owners of law "constant" never scale.

Graphs are captured widest first (vLLM's CudaGraphManager); a stage's capture windows map onto its
sizes in that order (a PIECEWISE graph is one window per piece), unless tags carry the size.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from memest.analysis.owners import OwnerRules, Verdict
from memest.errors import ReportFormatError
from memest.estimate.allocsim import PoolSim
from memest.schema import CapturePlan
from memest.snapshot.format import Snapshot, validate
from memest.snapshot.tags import DEFAULT_POOL, StageTag, parse_tag

_CONSTANT_OWNERS = ("kv_cache", "weights")


@dataclass(slots=True)
class _Alloc:
    handle: int
    size: int
    stream: int
    owner: str
    index: int


#: One request of a graph into the pool (handle, bytes, stream, owner, trace index): the public
#: name for code that writes a :class:`PoolTrace` itself (memest.preflight's synthetic trace).
PoolRequest = _Alloc


@dataclass(slots=True)
class Graph:
    """One captured graph of a stage: its requests and frees in trace order.

    ``ops`` holds requests (_Alloc) and frees (the freed request's handle); a free that came after
    the next graph had started is left out (that block stays live through the rest of the
    replay, as it did in the trace).
    """

    stage: str
    size: int
    ops: list[_Alloc | int] = field(default_factory=list)

    @property
    def allocs(self) -> list[_Alloc]:
        return [a for a in self.ops if isinstance(a, _Alloc)]


@dataclass(frozen=True, slots=True)
class PoolTrace:
    """The capture pool's graphs per stage (stages in capture order) and its measured growth.

    ``measured`` charges each segment the trace reserved to the (stage, owner) of its stack, as
    memest.analysis.replay's trigger table does.
    """

    source: str
    stages: dict[str, list[Graph]]
    measured: dict[tuple[str, str], int]
    measured_segments: dict[str, int]

    def stage_bytes(self, stage: str) -> int:
        return sum(b for (s, _), b in self.measured.items() if s == stage)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Simulated pool growth per (stage, owner) and segment count per stage."""

    bytes_by_owner: dict[tuple[str, str], int]
    segments_by_stage: dict[str, int]
    graphs_by_stage: dict[str, int]

    def stage_bytes(self, stage: str) -> int:
        return sum(b for (s, _), b in self.bytes_by_owner.items() if s == stage)


def _pool_of(tag: StageTag, window_pool: dict[int, str]) -> str:
    if tag.pool:
        return tag.pool
    if tag.window is not None and tag.window in window_pool:
        return window_pool[tag.window]
    return DEFAULT_POOL


def _capture_windows(
    snap: Snapshot, phase: str, source: str
) -> tuple[dict[str, list[int]], dict[int, str]]:
    """The capture windows of ``phase`` per stage (sorted), and the pool each window captured
    into where the snapshot says so."""
    windows: dict[str, list[int]] = defaultdict(list)
    window_pool: dict[int, str] = {}
    for w in snap.get("windows", []):
        if not isinstance(w, dict) or w.get("window") is None:
            continue
        t = parse_tag(str(w.get("tag") or ""))
        if w.get("pool"):
            window_pool[int(w["window"])] = str(w["pool"])
        if w.get("kind", "capture") == "capture" and t.phase == phase and t.stage:
            windows[t.stage].append(int(w["window"]))
    if not windows:
        raise ReportFormatError(f"{source}: no CUDA-graph capture windows in phase {phase!r}")
    for ws in windows.values():
        ws.sort()
    return dict(windows), window_pool


def _graph_of_window(
    windows: dict[str, list[int]], plan: CapturePlan, phase: str, source: str
) -> dict[int, tuple[str, int]]:
    """(stage, capture size) of each window: graphs are captured widest first, a PIECEWISE graph
    one window per piece."""
    sizes_of = {r.runner: sorted(r.sizes, reverse=True) for r in plan.runners}
    out: dict[int, tuple[str, int]] = {}
    for stage, ws in windows.items():
        sizes = sizes_of.get(stage)
        if not sizes:
            continue
        if len(ws) % len(sizes):
            raise ReportFormatError(
                f"{source}: stage {stage} has {len(ws)} capture windows in phase {phase!r}, "
                f"not a multiple of its {len(sizes)} graphs in grid G"
            )
        pieces = len(ws) // len(sizes)
        for k, w in enumerate(ws):
            out[w] = (stage, sizes[k // pieces])
    return out


class _Cutter:
    """Walks the snapshot's events once: segments of the capture pools (measured growth, charged
    to the (stage, owner) of their stack) and each graph's requests and frees."""

    def __init__(
        self,
        snap: Snapshot,
        phase: str,
        rules: OwnerRules,
        windows: tuple[dict[str, list[int]], dict[int, str]],
        graph_of_window: dict[int, tuple[str, int]],
    ) -> None:
        self.phase, self.rules = phase, rules
        self.frames, self.stacks = snap["frames"], snap["stacks"]
        self.tags = [parse_tag(t) for t in snap["tags"]]
        stage_windows, self.window_pool = windows
        self.graph_of_window = graph_of_window
        self.pools = {
            self.window_pool[w]
            for ws in stage_windows.values()
            for w in ws
            if w in self.window_pool
        }
        self.pools |= {
            t.pool for t in self.tags if t.pool and t.phase == phase and t.stage in stage_windows
        }
        self.seg_starts: list[int] = []
        self.seg_end: dict[int, tuple[int, str]] = {}
        self.frame_cache: dict[int, Verdict] = {}
        self.owner_cache: dict[int, str] = {}
        self.graphs: dict[tuple[str, int], Graph] = {}
        self.order: list[tuple[str, int]] = []
        self.live: dict[int, tuple[str, int]] = {}
        self.current: dict[str, tuple[str, int]] = {}
        self.measured: dict[tuple[str, str], int] = defaultdict(int)
        self.segments: dict[str, int] = defaultdict(int)

    def owner(self, stack: int) -> str:
        hit = self.owner_cache.get(stack)
        if hit is None:
            indices = self.stacks[stack] if stack >= 0 else []
            hit = self.rules.classify_indexed(self.frames, indices, self.frame_cache)[0]
            self.owner_cache[stack] = hit
        return hit

    def in_pool(self, addr: int) -> bool:
        i = bisect.bisect_right(self.seg_starts, addr) - 1
        if i < 0:
            return False
        end, pool = self.seg_end[self.seg_starts[i]]
        return addr < end and pool in self.pools

    def segment_added(self, addr: int, size: int, tag: StageTag, stack: int) -> None:
        # The pool of a segment is known from its tag only; addresses recur across pools.
        pool = _pool_of(tag, self.window_pool)
        bisect.insort(self.seg_starts, addr)
        self.seg_end[addr] = (addr + size, pool)
        if pool in self.pools and tag.phase == self.phase:
            self.measured[(tag.stage, self.owner(stack))] += size
            self.segments[tag.stage] += 1

    def segment_removed(self, addr: int) -> None:
        if addr in self.seg_end:
            del self.seg_end[addr]
            self.seg_starts.pop(bisect.bisect_left(self.seg_starts, addr))

    def request(self, i: int, addr: int, size: int, stream: int, tag: StageTag, stack: int) -> None:
        if tag.phase != self.phase or not self.in_pool(addr):
            return
        key = self.graph_of_window.get(tag.window) if tag.window is not None else None
        if tag.capture_size is not None and tag.stage:
            key = (tag.stage, tag.capture_size)
        key = key or self.current.get(tag.stage)
        if key is None:
            return  # before the stage's first window: not a graph's request
        self.current[key[0]] = key
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = Graph(key[0], key[1])
            self.order.append(key)
        graph.ops.append(_Alloc(addr, size, stream, self.owner(stack), i))
        self.live[addr] = key

    def freed(self, addr: int) -> None:
        key = self.live.pop(addr, None)
        if key is not None and self.order[-1] == key:
            self.graphs[key].ops.append(addr)

    def walk(self, snap: Snapshot) -> None:
        ev, actions = snap["events"], snap["actions"]
        free_action = "free_completed" if "free_completed" in actions else "free_requested"
        for i, (a, addr, size, stream, tag_i, stack) in enumerate(
            zip(
                ev["action"],
                ev["addr"],
                ev["size"],
                ev["stream"],
                ev["tag"],
                ev["stack"],
                strict=True,
            )
        ):
            act, tag = actions[a], self.tags[tag_i]
            if act in ("segment_alloc", "segment_map"):
                self.segment_added(addr, size, tag, stack)
            elif act in ("segment_free", "segment_unmap"):
                self.segment_removed(addr)
            elif act == "alloc":
                self.request(i, addr, size, stream, tag, stack)
            elif act == free_action:
                self.freed(addr)

    def trace(self, source: str) -> PoolTrace:
        stages: dict[str, list[Graph]] = {}
        for key in self.order:
            stages.setdefault(key[0], []).append(self.graphs[key])
        return PoolTrace(source, stages, dict(self.measured), dict(self.segments))


def pool_trace(
    snapshot: Snapshot,
    plan: CapturePlan,
    *,
    phase: str = "capture",
    rules: OwnerRules | None = None,
    source: str = "snapshot",
) -> PoolTrace:
    """Cut the snapshot's capture-phase graph-pool requests into graphs per stage.

    Args:
        snapshot: memest snapshot of the run under ``plan``.
        plan: grid G (graph counts and sizes per runner = stage).
        phase: the phase whose pool is replayed; ``graph_profiling`` captures into another pool.

    Raises:
        ReportFormatError: the snapshot has no capture windows in ``phase``, or a stage's windows
            cannot be mapped onto its graphs.
    """
    snap = validate(snapshot, source=source)
    windows = _capture_windows(snap, phase, source)
    graph_of_window = _graph_of_window(windows[0], plan, phase, source)
    cutter = _Cutter(snap, phase, rules or OwnerRules.default(), windows, graph_of_window)
    cutter.walk(snap)
    return cutter.trace(source)


def _resized(src: Graph, ref: Graph | None, size: int) -> list[_Alloc | int]:
    """``src``'s requests for a graph of ``size``, moved along the line through ``ref``."""
    src_allocs = src.allocs
    ref_allocs = ref.allocs if ref is not None else []
    fit = ref is not None and len(ref_allocs) == len(src_allocs)
    new_size: dict[int, int] = {}
    for j, a in enumerate(src_allocs):
        if a.owner in _CONSTANT_OWNERS:
            value = Fraction(a.size)
        elif fit and ref is not None:
            slope = Fraction(a.size - ref_allocs[j].size, src.size - ref.size)
            value = a.size + slope * (size - src.size)
        else:
            value = Fraction(a.size * size, src.size)
        new_size[id(a)] = max(math.ceil(value), 1)
    return [
        _Alloc(op.handle, new_size[id(op)], op.stream, op.owner, op.index)
        if isinstance(op, _Alloc)
        else op
        for op in src.ops
    ]


def _graph_ops(graphs: Sequence[Graph], size: int) -> list[_Alloc | int]:
    """The requests of a ``size`` graph: measured if G captured it, else resized (module doc)."""
    by_size = sorted(graphs, key=lambda g: g.size)
    for g in by_size:
        if g.size == size:
            return list(g.ops)
    above = [g for g in by_size if g.size > size]
    src = above[0] if above else by_size[-1]
    k = by_size.index(src)
    others = [by_size[k - 1]] if k > 0 else []
    others += [by_size[k + 1]] if k + 1 < len(by_size) else []
    return _resized(src, others[0] if others else None, size)


def replay(trace: PoolTrace, plan: CapturePlan) -> ReplayResult:
    """Simulate the capture pool under ``plan``: stages in G's order, graphs widest first.

    Raises:
        ReportFormatError: ``plan`` captures graphs for a stage the snapshot has no requests of.
    """
    sim = PoolSim()
    charge: list[tuple[str, str]] = []
    counts: dict[str, int] = {}
    rows = {r.runner: r for r in plan.runners if r.sizes}
    known = list(trace.stages)
    missing = [s for s in rows if s not in trace.stages and trace.stage_bytes(s)]
    if missing:
        raise ReportFormatError(
            f"{trace.source}: no graph-pool requests of stage {missing[0]} in the capture phase; "
            "the allocator replay needs that stage's events"
        )
    for stage in known:
        row = rows.get(stage)
        if row is None:
            continue
        counts[stage] = len(row.sizes)
        for size in sorted(row.sizes, reverse=True):
            base = len(charge) << 64  # each replayed graph gets its own handles
            for op in _graph_ops(trace.stages[stage], size):
                if isinstance(op, _Alloc):
                    sim.alloc(base | op.handle, op.size, op.stream, len(charge))
                    charge.append((stage, op.owner))
                else:
                    sim.free(base | op)
    out: dict[tuple[str, str], int] = defaultdict(int)
    seg: dict[str, int] = defaultdict(int)
    for t in sim.triggers:
        stage, owner = charge[t.event_index]
        out[(stage, owner)] += t.segment_bytes
        seg[stage] += 1
    return ReplayResult(dict(out), dict(seg), counts)
