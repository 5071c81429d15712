"""What a term's law reads: one grid of one model, resolved once.

The pre-flight builds a Setup from a request (memest.preflight.predict.setup: config.json, flags,
vLLM's defaults and sizing); the laws of memest.estimate.terms.catalog read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from memest.estimate import hybrid_terms
from memest.estimate.model_shape import ModelShape
from memest.estimate.parallel import ParallelBytes
from memest.estimate.runner_buffers import (
    BUFFER_TERMS,
    GroupTable,
    ModelDims,
    RunnerGrid,
    group_tables,
    runner_buffer_bytes,
    term_bytes,
)
from memest.estimate.synthetic_trace import GraphPoolPrediction, IndexerDecode, pool_bytes
from memest.estimate.terms.context import workspace_tokens
from memest.estimate.terms.shape import parameter_bytes
from memest.schema import CapturePlan, KVCacheSpec, RunConfig

#: Drafter methods whose graphs the synthetic trace writes as measured (EAGLE3).
MEASURED_DRAFTER_PROGRAM = ("eagle3",)


@dataclass(frozen=True)
class Setup:
    """What the laws read: the shapes, the resolved grid and its capture plan (one grid, resolved
    once: the pools and the buffers are computed once per setup)."""

    target: ModelShape
    drafter: ModelShape | None
    config: RunConfig
    plan: CapturePlan
    gpu: str
    block_size: int
    attention_backend: str
    notes: tuple[str, ...] = ()
    mla_v_padded: bool = False  # MLA prefill pads v (FlashAttention 2)
    parallel: ParallelBytes = ParallelBytes({}, 0, 0, 0)  # what TP adds (estimate/parallel.py)
    indexer: IndexerDecode | None = None  # a DSA model's decode logits in FULL graphs
    # a hybrid's KV-cache groups (memest.preflight.hybrid): one block table each
    hybrid_kv: KVCacheSpec | None = field(default=None, compare=False, repr=False)
    model_config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def target_weight_bytes(self) -> int:
        """The target's parameter and buffer bytes: a hybrid architecture's own law
        (memest.estimate.hybrid_terms) or the shape law."""
        own = hybrid_terms.weight_bytes(self.model_config, self.target)
        return parameter_bytes(self.target) if own is None else own

    @property
    def mbt(self) -> int:
        assert self.config.max_num_batched_tokens is not None
        return self.config.max_num_batched_tokens

    @property
    def mla_workspace_tokens(self) -> int:
        """Tokens of MLA's chunked-prefill workspace (memest.estimate.mla_context)."""
        c = self.config
        assert c.max_model_len is not None and c.max_num_seqs is not None
        return workspace_tokens(self.target, c, self.block_size)

    @property
    def draft_steps(self) -> int:
        return max(self.config.num_speculative_tokens - 1, 1)

    @cached_property
    def graph_pools(self) -> GraphPoolPrediction:
        """The graph pools of the synthetic request trace (memest.estimate.synthetic_trace)."""
        return pool_bytes(
            self.plan,
            self.target,
            self.drafter,
            draft_steps=self.draft_steps,
            indexer=self.indexer,
            method=self.config.speculative_method,
        )

    def _runner(self) -> tuple[ModelDims, RunnerGrid]:
        t, d = self.target, self.drafter
        dims = ModelDims(
            hidden_size=t.hidden,
            vocab_size=t.vocab,
            dtype_bytes=t.dtype_bytes,
            drafter_hidden_size=d.hidden if d is not None else None,
            shape=t,
        )
        grid = RunnerGrid.from_config(self.config, block_size=self.block_size)
        tables = group_tables(self.hybrid_kv, grid.num_speculative_tokens)
        return dims, replace(grid, tables=tables)

    @property
    def kv_tables(self) -> tuple[GroupTable, ...]:
        """The block tables the runner allocates, one per KV-cache group (empty: one group)."""
        return self._runner()[1].tables

    def pools(self) -> GraphPoolPrediction:
        return self.graph_pools

    @property
    def num_sms(self) -> int:
        """Multiprocessors the runner buffers are sized by (memest.estimate.runner_buffers)."""
        return self._runner()[0].num_sms

    @cached_property
    def buffer_sizes(self) -> dict[str, int]:
        """vLLM 0.33.0's grid-sized buffers by name (memest.estimate.runner_buffers)."""
        return runner_buffer_bytes(*self._runner())

    def buffers(self) -> dict[str, int]:
        """vLLM 0.33.0's grid-sized buffers summed per term (memest.estimate.runner_buffers)."""
        return term_bytes(*self._runner())

    def buffer_names(self, term: str) -> str:
        """The grid-sized buffers charged to ``term`` in this setup, by name."""
        sizes = self.buffer_sizes
        return ", ".join(n for n, b in sizes.items() if b and BUFFER_TERMS[n] == term)

    def graph_layers(self) -> int:
        """Captured graphs times the decoder layers each runs (drafter rows: its layers)."""
        total = 0
        for row in self.plan.runners:
            shape = self.target if row.runner.startswith("target") else self.drafter
            layers = shape.num_layers if shape is not None else 0
            total += row.graph_count * layers * (self.draft_steps if ".steps" in row.runner else 1)
        return total
