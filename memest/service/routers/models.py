"""GET /api/v1/models and a model's history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from memest.builds.history import History, history
from memest.service import examples, store
from memest.service.deps import CacheDep, ReadAuth, SessionDep
from memest.service.schemas import ModelList, ModelSummary

router = APIRouter(prefix="/api/v1", tags=["models"], dependencies=[ReadAuth])

ModelQuery = Annotated[
    str,
    Query(
        description="Model name as reported (RunReport.model)",
        examples=["deepseek-ai/DeepSeek-V4-Flash-DSpark"],
        min_length=1,
        max_length=300,
    ),
]


@router.get("/models", response_model=ModelList, responses=examples.json_example(examples.MODELS))
def list_models(
    session: SessionDep,
    limit: Annotated[
        int, Query(ge=1, le=1000, description="Page size (models by name)", examples=[100])
    ] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9, description="Models to skip", examples=[0])] = 0,
) -> ModelList:
    """Models with stored runs, by name, a page at a time: how many runs, which build labels, and
    the newest run; ``count`` is the number of models stored."""
    rows, total = store.list_models(session, limit=limit, offset=offset)
    data = [
        ModelSummary(
            model=r.model,
            runs=r.runs,
            builds=r.builds,
            latest_run_id=r.latest_run_id,
            latest_created_at=r.latest_created_at,
        )
        for r in rows
    ]
    return ModelList(data=data, count=total)


@router.get(
    "/history",
    response_model=History,
    responses={**examples.json_example(examples.HISTORY), 404: {"description": "No such model"}},
)
def model_history(model: ModelQuery, session: SessionDep, cache: CacheDep) -> History:
    """A model's builds in time order: KV tokens, graph-pool bytes and vLLM's estimator error.

    Each point lists the figures that regressed against the previous build: KV tokens down by more
    than 1%, graph pool up by more than 5%, estimator error up by more than 0.25 GiB.
    """
    runs = store.model_runs(session, model)
    reports = [cache.get(store.lead_report(session, r.run_id)) for r in runs]
    return history(model, reports)
