"""Graph pools from a model's shape: a synthetic per-graph request trace, replayed.

On vLLM 0.33.0 the requests a captured graph makes into the pool depend on the model's
dimensions and the graph's token count only (memest.estimate.poolreplay: the 64-token graph of a
256-token grid and of a 64-token grid make the same requests). The measured traces of the Llama-8B
shape (tests/data/starts) show each target graph as one program repeated per decoder layer, every
request a multiple of the graph's tokens:

- prologue: two hidden-wide tensors, the QKV projection, the KV written, the attention output;
- per layer: two hidden-wide inputs, gate_up (2 x intermediate), the activation, the down
  projection and two more hidden-wide tensors, then the next layer's QKV and KV; each layer frees
  what the layer before it kept;
- an EAGLE3 drafter step is the same layer once, on a 2 x hidden input, and its FULL graphs add the
  draft logits (requests x vocabulary) and the sampled ids.

:func:`synthetic_trace` writes that program for a model's shape and every size of the capture plan
and :func:`pool_bytes` runs it through memest.estimate.poolreplay's allocator replay. The pre-flight
(memest.preflight) predicts every stage's pool with it; the what-if (memest.estimate.whatif) the
stages the measured start did not capture (an added drafter, or a drafter's later steps when K
changes).
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.estimate.model_shape import ModelShape
from memest.estimate.poolreplay import Graph, PoolRequest, PoolTrace, ReplayResult, replay
from memest.schema import CapturePlan, RunnerRow


@dataclass(slots=True)
class _Writer:
    """Appends requests and frees to one graph; handles are unique within it."""

    graph: Graph
    tokens: int
    stream: int = 0
    next_handle: int = 1

    def alloc(self, width_bytes: int, *, per: int | None = None, owner: str = "") -> int:
        handle = self.next_handle
        self.next_handle += 1
        size = max(width_bytes * (self.tokens if per is None else per), 1)
        self.graph.ops.append(
            PoolRequest(handle, size, self.stream, owner or "compiled_piece", len(self.graph.ops))
        )
        return handle

    def free(self, *handles: int) -> None:
        self.graph.ops.extend(handles)


def aux_layers(shape: ModelShape) -> tuple[int, ...]:
    """Layers whose output an EAGLE3 target keeps for the drafter (vLLM: 2, L/2, L - 3)."""
    n = shape.num_layers
    return tuple(sorted({2, n // 2, n - 3} & set(range(n))))


def _target_graph(
    shape: ModelShape, stage: str, size: int, tokens: int, aux: tuple[int, ...] = ()
) -> Graph:
    b = shape.dtype_bytes
    h, qkv, kv = b * shape.hidden, b * shape.qkv, b * shape.kv
    gate_up, act = (b * w for w in shape.mlp_widths)
    w = _Writer(Graph(stage, size), tokens)
    x0, x1, q, k = w.alloc(h), w.alloc(h), w.alloc(qkv), w.alloc(kv)
    attn = w.alloc(h)
    w.free(k, q, x1)
    kept = (x0, attn)
    retained: list[int] = []
    for layer in range(shape.num_layers):
        if layer in aux:  # the aux hidden state lives to the end of the graph
            retained.append(w.alloc(h, owner="aux_hidden_states"))
        a, c = w.alloc(h), w.alloc(h)
        gu = w.alloc(gate_up)
        w.free(c)
        ac = w.alloc(act)
        w.free(gu)
        d = w.alloc(h)
        w.free(ac)
        if layer == shape.num_layers - 1:
            w.free(a, d, *kept, *retained)
            break
        e, f = w.alloc(h), w.alloc(h)
        w.free(a)
        q, k = w.alloc(qkv), w.alloc(kv)
        w.free(*kept, k, q, f)
        kept = (d, e)
    return w.graph


def _draft_layer(w: _Writer, shape: ModelShape) -> tuple[int, ...]:
    """One EAGLE3 layer on a 2 x hidden input; returns the handles it leaves live."""
    b = shape.dtype_bytes
    h, qkv, kv = b * shape.hidden, b * shape.qkv, b * shape.kv
    gate_up, act = (b * x for x in shape.mlp_widths)
    x2 = w.alloc(h + b * shape.extra_input_hidden if shape.extra_input_hidden else h)
    q = w.alloc(qkv)
    w.free(x2)
    k = w.alloc(kv)
    a, c = w.alloc(h), w.alloc(h)
    w.free(k, q, a)
    r, s = w.alloc(h), w.alloc(h)
    gu = w.alloc(gate_up)
    w.free(s)
    ac = w.alloc(act)
    w.free(gu)
    d = w.alloc(h)
    w.free(ac)
    e, f = w.alloc(h), w.alloc(h)
    w.free(r)
    return (c, d, e, f)


def _draft_graph(shape: ModelShape, row: RunnerRow, size: int, tokens: int, vocab: int) -> Graph:
    w = _Writer(Graph(row.runner, size), tokens, stream=stream_of(row.runner))
    requests = size if row.unit == "requests" else max(tokens // max(row.q, 1), 1)
    live = _draft_layer(w, shape)
    if row.graph_mode != "PIECEWISE":
        logits = w.alloc(shape.dtype_bytes * vocab, per=requests, owner="gemm_workspace")
        ids = w.alloc(8, per=requests, owner="draft_logits")
        w.free(logits, *live, ids)
    else:
        w.free(*live)
    return w.graph


def stream_of(runner: str) -> int:
    """The capture stream of a runner: the target, the drafter's first step and its later steps
    capture on three streams (measured), so blocks never pass between them."""
    if runner.startswith("draft.steps"):
        return 2
    return 1 if runner.startswith("draft") else 0


@dataclass(frozen=True, slots=True)
class GraphPoolPrediction:
    """Predicted pool growth per capture stage and the replay behind it."""

    by_stage: dict[str, int]
    replay: ReplayResult
    draft_steps: int


def synthetic_trace(
    plan: CapturePlan,
    target: ModelShape,
    drafter: ModelShape | None = None,
    *,
    draft_steps: int = 1,
) -> PoolTrace:
    """The capture pool's graphs per stage, written from the shapes for every size of ``plan``.

    ``draft_steps`` is how many one-token draft layers a ``draft.steps`` graph runs (K - 1 for
    EAGLE3's later steps).
    """
    stages: dict[str, list[Graph]] = {}
    for row in plan.runners:
        if not row.sizes:
            continue
        graphs: list[Graph] = []
        for size in sorted(row.sizes, reverse=True):
            tokens = size * row.q if row.unit == "requests" else size
            if row.runner.startswith("target"):
                aux = aux_layers(target) if drafter is not None else ()
                graphs.append(_target_graph(target, row.runner, size, tokens, aux))
            elif drafter is not None:
                g = Graph(row.runner, size)
                for _ in range(draft_steps if row.runner.startswith("draft.steps") else 1):
                    g.ops.extend(
                        _renumbered(_draft_graph(drafter, row, size, tokens, target.vocab), g)
                    )
                graphs.append(g)
        if graphs:
            stages[row.runner] = graphs
    return PoolTrace("synthetic", stages, {}, {})


def _renumbered(src: Graph, into: Graph) -> list[PoolRequest | int]:
    """``src``'s ops with handles moved past those already in ``into``."""
    base = max((a.handle for a in into.allocs), default=0)
    out: list[PoolRequest | int] = []
    for op in src.ops:
        if isinstance(op, PoolRequest):
            out.append(PoolRequest(op.handle + base, op.size, op.stream, op.owner, op.index))
        else:
            out.append(op + base)
    return out


def pool_bytes(
    plan: CapturePlan,
    target: ModelShape,
    drafter: ModelShape | None = None,
    *,
    draft_steps: int = 1,
) -> GraphPoolPrediction:
    """Pool growth per capture stage: the synthetic trace replayed through the allocator model."""
    trace = synthetic_trace(plan, target, drafter, draft_steps=draft_steps)
    result = replay(trace, plan)
    by_stage = {row.runner: result.stage_bytes(row.runner) for row in plan.runners if row.sizes}
    return GraphPoolPrediction(by_stage, result, draft_steps)
