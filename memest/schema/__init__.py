"""The versioned report contract (pydantic v2). JSON on disk and on the wire; never pickle."""

from memest.schema._base import SCHEMA_VERSION, MemestModel
from memest.schema.breakdown import (
    Breakdown,
    LivePeak,
    MemoryReading,
    PhaseRecord,
    PhaseSplit,
    RetainedRow,
    StageGrowth,
    TriggerRow,
    UnattributedRow,
)
from memest.schema.estimate import EstimateComparison, EstimateRecord
from memest.schema.plan import CapturePlan, RunnerRow
from memest.schema.report import (
    BuildInfo,
    GpuInfo,
    KVCacheSpec,
    RunConfig,
    RunReport,
    VllmFigures,
)

__all__ = [
    "SCHEMA_VERSION",
    "Breakdown",
    "BuildInfo",
    "CapturePlan",
    "EstimateComparison",
    "EstimateRecord",
    "GpuInfo",
    "KVCacheSpec",
    "LivePeak",
    "MemestModel",
    "MemoryReading",
    "PhaseRecord",
    "PhaseSplit",
    "RetainedRow",
    "RunConfig",
    "RunReport",
    "RunnerRow",
    "StageGrowth",
    "TriggerRow",
    "UnattributedRow",
    "VllmFigures",
]
