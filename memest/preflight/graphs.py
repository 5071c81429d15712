"""Graph pools before any start: the synthetic per-graph request trace, replayed.

The trace and its replay are memest.estimate.synthetic_trace's (the what-if writes the stages a
measured start did not capture with it); re-exported here for the pre-flight's callers.
"""

from __future__ import annotations

from memest.estimate.synthetic_trace import (
    GraphPoolPrediction,
    aux_layers,
    pool_bytes,
    stream_of,
    synthetic_trace,
)

__all__ = ["GraphPoolPrediction", "aux_layers", "pool_bytes", "stream_of", "synthetic_trace"]
