"""GET /api/v1/compare: build A against build B, as in the seed's "main → PR" columns."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from memest.builds.compare import Comparison
from memest.reporters.views import compare
from memest.service import examples, store
from memest.service.deps import CacheDep, ReadAuth, SessionDep

router = APIRouter(prefix="/api/v1", tags=["compare"], dependencies=[ReadAuth])


@router.get(
    "/compare",
    response_model=Comparison,
    responses={
        **examples.json_example(examples.COMPARISON),
        404: {"description": "One of the runs does not exist"},
    },
)
def compare_runs(
    a: Annotated[
        str,
        Query(
            description="Run id of the baseline (e.g. main)",
            examples=["demo-deepseek-v4-flash-dspark-k7-main"],
            max_length=200,
        ),
    ],
    b: Annotated[
        str,
        Query(
            description="Run id of the change (e.g. the PR)",
            examples=["demo-deepseek-v4-flash-dspark-k7-pr"],
            max_length=200,
        ),
    ],
    session: SessionDep,
    cache: CacheDep,
) -> Comparison:
    """Compare two runs (their lowest-rank reports): added memory per phase split, pool growth
    per stage with widest shapes, graph counts per stage and per capture-plan runner, pool bytes
    per stage and owner, the estimates and the KV ratio (B over A)."""
    ra = cache.get(store.lead_report(session, a))
    rb = cache.get(store.lead_report(session, b))
    return compare(ra, rb)
