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
  draft logits (requests x vocabulary) and the sampled ids;
- a DSA model's FULL graphs add, in every layer, the indexer's logits of the graph's tokens over
  max_model_len positions (memest.estimate.indexer: FP32 on SM90; BF16 and vLLM's FP32 copy on
  SM100), freed before the layer's attention;
- a DSpark drafter's FULL block graph (R requests x K query slots) adds what vLLM 0.33.0's
  ``DSparkSpeculator._sample_sequential`` allocates, as measured (reports/vllm/dspark.md): the
  gathered head hidden states (R x K x hidden), the base logits over all K positions
  (R x K x V), then per draft step the Markov embedding (R x markov_rank), the Markov bias and the
  step's logits (R x V each) and the sampled ids; each step's tensors are freed when the next
  step's replace them, so two of each are alive at once.

:func:`synthetic_trace` writes that program for a model's shape and every size of the capture plan
and :func:`pool_bytes` runs it through memest.estimate.poolreplay's allocator replay. The pre-flight
(memest.preflight) predicts every stage's pool with it; the what-if (memest.estimate.whatif) the
stages the measured start did not capture (an added drafter, or a drafter's later steps when K
changes).
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.analysis.owners import (
    INDEXER_LOGITS_BF16,
    INDEXER_LOGITS_FP32_COPY,
    INDEXER_LOGITS_FP32_KERNEL,
)
from memest.estimate.indexer import FP32_BYTES, indexer_logits
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


@dataclass(frozen=True, slots=True)
class IndexerDecode:
    """What sizes a DSA model's indexer logits in a FULL graph: the positions scored
    (max_model_len) and the kernel's element bytes (memest.estimate.indexer)."""

    positions: int
    kernel_element_bytes: int = FP32_BYTES


def _indexer_call(w: _Writer, idx: IndexerDecode | None) -> None:
    """One layer's indexer logits in a FULL graph: allocated, then freed after its top-k."""
    if idx is None:
        return
    logits = indexer_logits(w.tokens, idx.positions, idx.kernel_element_bytes)
    if not logits.fp32_copy_bytes:
        w.free(w.alloc(logits.kernel_bytes, per=1, owner=INDEXER_LOGITS_FP32_KERNEL))
        return
    kernel = w.alloc(logits.kernel_bytes, per=1, owner=INDEXER_LOGITS_BF16)
    copy = w.alloc(logits.fp32_copy_bytes, per=1, owner=INDEXER_LOGITS_FP32_COPY)
    w.free(kernel, copy)


def _target_graph(
    shape: ModelShape,
    stage: str,
    size: int,
    tokens: int,
    aux: tuple[int, ...] = (),
    indexer: IndexerDecode | None = None,
) -> Graph:
    b = shape.dtype_bytes
    h, qkv, kv = b * shape.hidden, b * shape.qkv, b * shape.kv
    gate_up, act = (b * w for w in shape.mlp_widths)
    w = _Writer(Graph(stage, size), tokens)
    x0, x1, q, k = w.alloc(h), w.alloc(h), w.alloc(qkv), w.alloc(kv)
    _indexer_call(w, indexer)
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
        _indexer_call(w, indexer)
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


#: Bytes of a sampled or anchor token id (int64).
ID_BYTES = 8


def _dspark_sampling(w: _Writer, shape: ModelShape, requests: int, steps: int) -> None:
    """DSparkSpeculator._sample_sequential (vLLM 0.33.0) in one FULL block graph: see the module
    docstring; owners as memest.analysis.owners names them."""
    b, vocab = shape.dtype_bytes, shape.vocab
    hidden = w.alloc(b * shape.hidden, per=requests * steps, owner="draft_sample_hidden")
    base = w.alloc(b * vocab, per=requests * steps, owner="draft_logits")
    prev = w.alloc(ID_BYTES, per=requests, owner="draft_sampler")
    live: dict[str, int] = {"draft_sampler": prev}
    for _ in range(steps):
        # each name is rebound after its call returns: the new tensor is taken while the
        # previous step's is still alive, which is freed right after
        for owner, width in (
            ("draft_markov_embed", b * shape.markov_rank),
            ("draft_logits.markov_bias", b * vocab),
            ("draft_logits.step", b * vocab),
            ("draft_sampler", ID_BYTES),
        ):
            handle = w.alloc(width, per=requests, owner=owner)
            if owner in live:
                w.free(live[owner])
            live[owner] = handle
    w.free(hidden, base, *live.values())


def _draft_graph(
    shape: ModelShape,
    row: RunnerRow,
    size: int,
    tokens: int,
    vocab: int,
    method: str | None = None,
) -> Graph:
    w = _Writer(Graph(row.runner, size), tokens, stream=stream_of(row.runner))
    requests = size if row.unit == "requests" else max(tokens // max(row.q, 1), 1)
    live = _draft_layer(w, shape)
    if (
        method == "dspark"
        and row.graph_mode != "PIECEWISE"
        and row.runner.startswith("draft.block")
    ):
        _dspark_sampling(w, shape, requests, max(row.q, 1))
        w.free(*live)
    elif row.graph_mode != "PIECEWISE":
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
    indexer: IndexerDecode | None = None,
    method: str | None = None,
) -> PoolTrace:
    """The capture pool's graphs per stage, written from the shapes for every size of ``plan``.

    ``draft_steps`` is how many one-token draft layers a ``draft.steps`` graph runs (K - 1 for
    EAGLE3's later steps). ``indexer``: a DSA target's decode logits, written in every target
    FULL graph (None: none, or a target without an indexer). ``method``: the drafter's
    (``dspark`` writes its block routine's sampling as measured).
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
                idx = indexer if target.sparse and row.graph_mode == "FULL" else None
                graphs.append(_target_graph(target, row.runner, size, tokens, aux, idx))
            elif drafter is not None:
                g = Graph(row.runner, size)
                for _ in range(draft_steps if row.runner.startswith("draft.steps") else 1):
                    graph = _draft_graph(drafter, row, size, tokens, target.vocab, method)
                    g.ops.extend(_renumbered(graph, g))
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
    indexer: IndexerDecode | None = None,
    method: str | None = None,
) -> GraphPoolPrediction:
    """Pool growth per capture stage: the synthetic trace replayed through the allocator model
    (``indexer`` and ``method`` as :func:`synthetic_trace` takes them)."""
    trace = synthetic_trace(
        plan, target, drafter, draft_steps=draft_steps, indexer=indexer, method=method
    )
    result = replay(trace, plan)
    by_stage = {row.runner: result.stage_bytes(row.runner) for row in plan.runners if row.sizes}
    return GraphPoolPrediction(by_stage, result, draft_steps)
