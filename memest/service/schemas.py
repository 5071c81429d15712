"""Pydantic I/O of the API (the ORM rows are never response models)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from memest.analysis.ranks import RankCheck
from memest.analysis.stages import StageBar
from memest.builds.runs import RunFacts, RunnerCount
from memest.schema import (
    Breakdown,
    CapturePlan,
    EstimateComparison,
    LivePeak,
    PhaseSplit,
    RetainedRow,
    StartAccounting,
)

#: Stage bars in the run and breakdown APIs: the stages of most pool growth, the rest summed as
#: one "other" stage, and a stage's largest owners, the rest as "other" (no real report comes
#: near either: at most 10 stages and 3 owners each under tests/data/reports). The breakdown's
#: own rows are returned whole.
API_STAGES = 64
API_OWNERS_PER_STAGE = 16

STAGES_DESCRIPTION = (
    f"Pool growth per stage, split by owner: the {API_STAGES - 1} stages of most growth (the "
    f"rest summed as stage 'other') and each stage's {API_OWNERS_PER_STAGE - 1} largest owners "
    "(the rest as owner 'other')"
)


class IngestResponse(BaseModel):
    """Outcome of POST /api/v1/reports."""

    status: Literal["created", "exists"] = Field(
        description="created: stored now; exists: this report id was already stored, same content"
    )
    report_id: str
    run_id: str


class DeleteResponse(BaseModel):
    """Outcome of DELETE /api/v1/runs/{run_id}."""

    status: Literal["deleted"]
    run_id: str
    report_ids: list[str] = Field(description="The run's reports, deleted with it")


class ModelSummary(BaseModel):
    model: str
    runs: int = Field(description="Runs stored for this model")
    builds: list[str] = Field(description="Build labels seen, oldest first")
    latest_run_id: str
    latest_created_at: datetime


class ModelList(BaseModel):
    data: list[ModelSummary]
    count: int


class RunSummary(BaseModel):
    run_id: str
    model: str
    build: str = Field(description="Build label, e.g. main or PR-123")
    commit: str | None = Field(description="vLLM commit")
    vllm_version: str | None
    gpu: str | None
    source: str = Field(description="measured, published or synthetic")
    world_size: int
    created_at: datetime
    ranks: list[int] = Field(description="Ranks whose reports are stored")


class RunList(BaseModel):
    data: list[RunSummary]
    count: int = Field(description="Runs matching the filters, before limit/offset")


class RankFacts(BaseModel):
    rank: int
    report_id: str
    facts: RunFacts


class RunDetail(BaseModel):
    """One run: breakdown beside its capture plan, the estimates, and every rank."""

    run: RunSummary
    lead_rank: int = Field(description="Rank whose report the breakdown shows (lowest stored)")
    accounting: StartAccounting = Field(
        description="The lead rank's accounting (memest.estimate.account): the figures every "
        "surface shows"
    )
    facts: RunFacts
    phases: list[PhaseSplit]
    stages: list[StageBar] = Field(description=STAGES_DESCRIPTION)
    runners: list[RunnerCount] = Field(description="Graph-count table of the capture plan")
    capture_plans: list[CapturePlan]
    live_peaks: list[LivePeak]
    retained: list[RetainedRow]
    stored_estimate: EstimateComparison | None = Field(
        description="The estimate block as the plugin stored it at the end of init, kept for "
        "audit: superseded by `accounting` (recomputed from the report's readings with the "
        "current definitions); no surface quotes its figures"
    )
    stored_estimate_status: str = Field(
        default="superseded by accounting",
        description="What stored_estimate is: always 'superseded by accounting'",
    )
    computed_estimate: EstimateComparison | None = Field(
        default=None, description="memest.estimate.compare(report), when available"
    )
    computed_estimate_unavailable: str | None = Field(
        default=None, description="Why computed_estimate is absent"
    )
    rank_check: RankCheck
    ranks: list[RankFacts]
    notes: list[str] = Field(
        description="The report's notes as pages show them (byte figures in GiB, paths cut to "
        "file names); the raw notes are in the stored report (GET .../ranks/{rank})"
    )
    diagnostics: list[str] = Field(
        default_factory=list,
        description="The plugin's diagnostics (allocator history stage rows, where files were "
        "kept), apart from the notes",
    )
    hook_errors: list[str]


class BreakdownResponse(BaseModel):
    run_id: str
    rank: int
    model: str
    build: str
    breakdown: Breakdown | None
    stages: list[StageBar] = Field(description=STAGES_DESCRIPTION)
