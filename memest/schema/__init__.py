"""The versioned report contract (pydantic v2). JSON on disk and on the wire; never pickle."""

from memest.schema._base import SCHEMA_VERSION, MemestModel
from memest.schema.accounting import StartAccounting
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
from memest.schema.estimate import (
    EstimateComparison,
    EstimateRecord,
    FullInitTerms,
    OwnerPrediction,
    StartupPlanInputs,
    VllmGraphProfile,
    WhatIf,
)
from memest.schema.plan import CapturePlan, RunnerRow
from memest.schema.report import (
    BuildInfo,
    CompiledCode,
    CompiledFile,
    CompiledNode,
    CompiledSite,
    GpuInfo,
    KVCacheSpec,
    ModelShape,
    RunConfig,
    RunReport,
    VllmFigures,
)

__all__ = [
    "SCHEMA_VERSION",
    "Breakdown",
    "BuildInfo",
    "CapturePlan",
    "CompiledCode",
    "CompiledFile",
    "CompiledNode",
    "CompiledSite",
    "EstimateComparison",
    "EstimateRecord",
    "FullInitTerms",
    "GpuInfo",
    "KVCacheSpec",
    "ModelShape",
    "LivePeak",
    "MemestModel",
    "MemoryReading",
    "OwnerPrediction",
    "PhaseRecord",
    "PhaseSplit",
    "RetainedRow",
    "RunConfig",
    "RunReport",
    "RunnerRow",
    "StageGrowth",
    "StartAccounting",
    "StartupPlanInputs",
    "TriggerRow",
    "UnattributedRow",
    "VllmFigures",
    "VllmGraphProfile",
    "WhatIf",
]
