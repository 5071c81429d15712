"""What-if: from one measured start under grid G, predict every term and the KV budget under G'.

The grid enters at one edge (grid.py: a typed (plan, config) pair for G and G'), then the pool
predictors (pools.py, graph_objects.py), then the term movers (terms.py), then the KV budget
(budget.py); question.py is the typed entry point (WhatIfQuestion -> WhatIfAnswer, with the
inverse answers) every surface calls, the calibration handed in (models.py).
"""

from __future__ import annotations

from memest.estimate.whatif.budget import kv_spec_to, term_rows, what_if
from memest.estimate.whatif.graph_objects import GRAPH_OBJECTS, graph_layers
from memest.estimate.whatif.grid import (
    Grids,
    check_plan,
    describe_grid,
    grids,
    is_overlay,
    measured_plan,
    resolve_grid,
    runner_text,
)
from memest.estimate.whatif.models import (
    TermRow,
    WhatIfAnswer,
    WhatIfCalibration,
    WhatIfQuestion,
)
from memest.estimate.whatif.pools import law_for, pool_predictions
from memest.estimate.whatif.question import answer
from memest.estimate.whatif.terms import DRAFTER_COMPILED_MODELS

__all__ = [
    "DRAFTER_COMPILED_MODELS",
    "GRAPH_OBJECTS",
    "Grids",
    "TermRow",
    "WhatIfAnswer",
    "WhatIfCalibration",
    "WhatIfQuestion",
    "answer",
    "check_plan",
    "describe_grid",
    "graph_layers",
    "grids",
    "is_overlay",
    "kv_spec_to",
    "law_for",
    "measured_plan",
    "pool_predictions",
    "resolve_grid",
    "runner_text",
    "term_rows",
    "what_if",
]
