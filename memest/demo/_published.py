"""The seed's published GB200 tables, turned into RunReports (GiB figures → int bytes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from memest.schema import (
    Breakdown,
    BuildInfo,
    CapturePlan,
    EstimateComparison,
    EstimateRecord,
    GpuInfo,
    LivePeak,
    PhaseSplit,
    RetainedRow,
    RunConfig,
    RunReport,
    StageGrowth,
    TriggerRow,
    VllmFigures,
)
from memest.units import GiB

SEED_DOCUMENT = "shared/seed/000_1e0d078d85c3458b.txt"
#: Orders main before the change in history views; it is not the date of the measurement.
PUBLISHED_AT = datetime(2026, 1, 1, tzinfo=UTC)
DEMO_MODELS = ("deepseek-ai/DeepSeek-V4-Flash-DSpark", "nvidia/MiniMax-M3-NVFP4")
DEMO_BUILDS = ("main", "PR")
_COMMITS = {"main": "60a7d568f4", "PR": "30c305c944"}
_INSTRUMENTED = {"main": "9ac2d91b11", "PR": "79fb06ad41"}


def _b(gib_value: float) -> int:
    """Published GiB (three decimals) to int bytes."""
    return round(gib_value * GiB)


@dataclass(frozen=True)
class _Stage:
    stage: str
    gib: float
    graph_count: int
    widest: str


@dataclass(frozen=True)
class _Owner:
    stage: str
    owner: str
    gib: float
    note: str = ""


@dataclass(frozen=True)
class _Build:
    total: float
    pool: float
    other_torch: float
    outside: float
    stages: tuple[_Stage, ...]
    cudagraph_estimate: float
    kv_tokens: int
    usage_minus_budget: float
    triggers: tuple[_Owner, ...] = ()
    retained: tuple[_Owner, ...] = ()
    live_peaks: tuple[_Owner, ...] = ()
    usage_minus_budget_with_fix: float | None = None
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class _Deployment:
    slug: str
    model: str
    method: str
    k: int
    gpu_memory_utilization: float | None
    description: str
    builds: dict[str, _Build]


_DEEPSEEK = _Deployment(
    slug="deepseek-v4-flash-dspark-k7",
    model=DEMO_MODELS[0],
    method="dspark",
    k=7,
    gpu_memory_utilization=None,
    description="DeepSeek-V4-Flash, TP4 + EP, DSpark K=7, 1M context, 4096-token decode budget",
    builds={
        "main": _Build(
            total=5.81,
            pool=4.326,
            other_torch=0.195,
            outside=1.293,
            stages=(
                _Stage("target.piecewise", 0.912, 83, "1024 tokens"),
                _Stage("target.full", 2.674, 80, "128 requests x q=8"),
                _Stage("draft.block.full", 0.740, 80, "144 requests x q=7"),
            ),
            cudagraph_estimate=8.56,
            kv_tokens=7_660_426,
            usage_minus_budget=4.73,
            live_peaks=(_Owner("draft.block.full", "draft_logits", 0.55),),
        ),
        "PR": _Build(
            total=18.66,
            pool=17.051,
            other_torch=0.891,
            outside=0.721,
            stages=(
                _Stage("target.piecewise", 3.531, 39, "8192 tokens"),
                _Stage("target.full", 10.525, 48, "512 requests x q=8"),
                _Stage("draft.block.full", 2.994, 51, "585 requests x q=7"),
            ),
            cudagraph_estimate=29.19,
            kv_tokens=6_208_214,
            usage_minus_budget=-3.81,
            usage_minus_budget_with_fix=0.59,
            triggers=(
                _Owner("target.full", "indexer_logits_fp32", 8.016, "BF16 -> FP32 conversion"),
                _Owner("target.full", "indexer_logits_bf16", 2.004, "original BF16 output"),
                _Owner("target.full", "attn_output", 0.250, "_alloc_attn_out"),
                _Owner("target.full", "qnorm_rope_kv_insert", 0.250, "_fused_qnorm_rope_kv_insert"),
                _Owner(
                    "target.full",
                    "unattributed:remaining capture sizes",
                    0.006,
                    "remaining FULL capture sizes after the widest capture",
                ),
            ),
            retained=(_Owner("target.piecewise", "aux_hidden_states", 2.918),),
            live_peaks=(_Owner("draft.block.full", "draft_logits", 2.22),),
            notes=("The instrumented PR startup had 6,208,515 KV tokens.",),
        ),
    },
)

_MINIMAX = _Deployment(
    slug="minimax-m3-eagle3-k3",
    model=DEMO_MODELS[1],
    method="eagle3",
    k=3,
    gpu_memory_utilization=0.9,
    description="MiniMax-M3-NVFP4, TP4, EAGLE3 K=3",
    builds={
        "main": _Build(
            total=3.15,
            pool=1.799,
            other_torch=0.598,
            outside=0.750,
            stages=(
                _Stage("target.piecewise", 1.273, 83, "1024 tokens"),
                _Stage("target.full", 0.229, 81, "256 requests x q=4"),
                _Stage("draft.step0.piecewise", 0.088, 83, "1024 tokens"),
                _Stage("draft.step0.full", 0.025, 81, "256 requests x q=4"),
                _Stage("draft.steps.full", 0.184, 83, "1024 requests x q=1"),
            ),
            cudagraph_estimate=4.60,
            kv_tokens=3_575_296,
            usage_minus_budget=2.54,
            triggers=(
                _Owner(
                    "target.piecewise",
                    "aux_hidden_states",
                    1.224,
                    "kept across capture sizes",
                ),
                _Owner("target.piecewise", "unattributed:other pool space", 0.050),
            ),
            retained=(_Owner("target.piecewise", "aux_hidden_states", 1.224),),
        ),
        "PR": _Build(
            total=7.72,
            pool=6.127,
            other_torch=0.854,
            outside=0.738,
            stages=(
                _Stage("target.piecewise", 4.619, 39, "8192 tokens"),
                _Stage("target.full", 0.662, 64, "1024 requests x q=4"),
                _Stage("draft.step0.piecewise", 0.662, 39, "8192 tokens"),
                _Stage("draft.step0.full", 0.000, 64, "1024 requests x q=4"),
                _Stage("draft.steps.full", 0.184, 64, "1024 requests x q=1"),
            ),
            cudagraph_estimate=9.23,
            kv_tokens=3_358_336,
            usage_minus_budget=2.09,
            usage_minus_budget_with_fix=0.42,
            triggers=(
                _Owner(
                    "target.piecewise",
                    "aux_hidden_states",
                    4.378,
                    "kept across capture sizes",
                ),
                _Owner("target.piecewise", "unattributed:other pool space", 0.241),
                _Owner("target.full", "moe_workspace", 0.56250, "FlashInfer MoE tactic"),
                _Owner("target.full", "gemm_workspace", 0.09375, "MXFP8 GEMMs"),
                _Owner("target.full", "unattributed:other capture sizes", 0.00586),
            ),
            retained=(_Owner("target.piecewise", "aux_hidden_states", 4.378),),
            live_peaks=(
                _Owner("target.piecewise", "moe_workspace", 0.678),
                _Owner("target.full", "moe_workspace", 0.290),
            ),
        ),
    },
)

_DEPLOYMENTS = (_DEEPSEEK, _MINIMAX)


def _capture_plans(dep: _Deployment, build: str) -> list[CapturePlan]:
    """The deployment's capture plan from memest.plan: vLLM 0.33.0 sizing on main, the seed's
    five fields (defaults) on the change; GB200 serve defaults."""
    from memest.plan import plan_input_from_compilation_config, resolve

    inp = plan_input_from_compilation_config(
        None,
        sm100=True,
        max_num_seqs=1024,
        max_num_batched_tokens=16384,
        spec_method=dep.method,
        num_speculative_tokens=dep.k,
        gpu="gb200",
    )
    return [resolve(inp, "vllm-0.33.0" if build == "main" else "seed")]


def demo_report(slug: str, build: str) -> RunReport:
    """One published deployment on one build, as a rank-0 RunReport.

    Args:
        slug: ``deepseek-v4-flash-dspark-k7`` or ``minimax-m3-eagle3-k3``.
        build: ``main`` or ``PR``.

    Raises:
        KeyError: unknown slug or build.
    """
    found = [d for d in _DEPLOYMENTS if d.slug == slug]
    if not found or build not in DEMO_BUILDS:
        raise KeyError(f"unknown demo {slug!r}/{build!r}; known: {', '.join(_slugs())} x main, PR")
    dep = found[0]
    b = dep.builds[build]
    run_id = f"demo-{dep.slug}-{build.lower()}"
    stages = [
        StageGrowth(
            stage=s.stage,
            pool_growth_bytes=_b(s.gib),
            graph_count=s.graph_count,
            widest=s.widest,
        )
        for s in b.stages
    ]
    records = [
        EstimateRecord(
            estimator="vllm",
            cudagraph_estimate_bytes=_b(b.cudagraph_estimate),
            usage_minus_budget_bytes=_b(b.usage_minus_budget),
            note="Estimated CUDA-graph memory (serving run); usage minus budget from the "
            "estimator table (separate diagnostic launch).",
        ),
        EstimateRecord(
            estimator="measured",
            kv_tokens=b.kv_tokens,
            note="Measured KV capacity from the serving comparison.",
        ),
    ]
    if b.usage_minus_budget_with_fix is not None:
        records.append(
            EstimateRecord(
                estimator="published",
                usage_minus_budget_bytes=_b(b.usage_minus_budget_with_fix),
                note="This PR with the full-initialization estimate fix (prototype).",
            )
        )
    index = [d.slug for d in _DEPLOYMENTS].index(dep.slug)
    created = PUBLISHED_AT + timedelta(hours=index * 2 + (1 if build == "PR" else 0))
    return RunReport(
        report_id=f"{run_id}-rank0",
        run_id=run_id,
        rank=0,
        world_size=4,
        created_at=created,
        source="published",
        model=dep.model,
        build=BuildInfo(label=build, vllm_commit=_COMMITS[build]),
        gpu=GpuInfo(name="NVIDIA GB200", compute_capability="10.0"),
        config=RunConfig(
            model=dep.model,
            max_num_seqs=1024,
            max_num_batched_tokens=16384,
            gpu_memory_utilization=dep.gpu_memory_utilization,
            tensor_parallel_size=4,
            speculative_method=dep.method,
            num_speculative_tokens=dep.k,
            cudagraph_mode="FULL_AND_PIECEWISE",
            model_runner="v2",
        ),
        capture_plans=_capture_plans(dep, build),
        breakdown=Breakdown(
            phases=[
                PhaseSplit(
                    phase="capture",
                    total_added_bytes=_b(b.total),
                    graph_pool_bytes=_b(b.pool),
                    other_torch_bytes=_b(b.other_torch),
                    outside_torch_bytes=_b(b.outside),
                )
            ],
            stages=stages,
            triggers=[
                TriggerRow(stage=o.stage, owner=o.owner, bytes=_b(o.gib), note=o.note)
                for o in b.triggers
            ],
            retained=[
                RetainedRow(stage=o.stage, owner=o.owner, bytes=_b(o.gib)) for o in b.retained
            ],
            live_peaks=[
                LivePeak(stage=o.stage, owner=o.owner, peak_bytes=_b(o.gib)) for o in b.live_peaks
            ],
            graph_pool_growth_bytes=_b(b.pool),
        ),
        estimate=EstimateComparison(records=records),
        vllm=VllmFigures(
            cudagraph_estimate_bytes=_b(b.cudagraph_estimate),
            cudagraph_actual_bytes=_b(b.total),
        ),
        notes=[
            "Published GB200 figures (from a public write-up), GiB/GPU rank 0 with three "
            "decimals; not measured by memest.",
            dep.description + ".",
            f"Allocator breakdown from the instrumented build {_INSTRUMENTED[build]} "
            f"({_COMMITS[build]} + instrumentation); KV counts from the serving comparison.",
            "Only rank 0 was published; ranks 1-3 are absent.",
            *b.notes,
        ],
    )


def _slugs() -> list[str]:
    return [d.slug for d in _DEPLOYMENTS]


def demo_reports() -> list[RunReport]:
    """Every demo report: both deployments on main and on the change (four rank-0 reports)."""
    return [demo_report(d.slug, build) for d in _DEPLOYMENTS for build in DEMO_BUILDS]
