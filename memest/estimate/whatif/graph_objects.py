"""CUDA graph objects: driver memory outside PyTorch that grows while graphs are captured.

They are charged per captured graph by the decoder layers it holds (law "graph_count_x_layers").
"""

from __future__ import annotations

from memest.estimate.phases import phase
from memest.estimate.runner_buffers import ModelDims
from memest.schema import CapturePlan, OwnerPrediction, RunReport

GRAPH_OBJECTS = "graph_objects"


def _outside_growth(report: RunReport, name: str) -> int:
    record = phase(report, name)
    if record is None:
        return 0
    start, end = record.start, record.end
    if start.device_used_bytes is None or end.device_used_bytes is None:
        return 0
    before = start.device_used_bytes - start.torch_reserved_bytes
    after = end.device_used_bytes - end.torch_reserved_bytes
    return max(after - before, 0)


def graph_object_bytes(report: RunReport) -> int:
    """Outside-PyTorch growth while graphs are captured (graph objects and driver memory).

    vLLM 0.33.0 captures every graph once during graph-memory profiling and again in the real
    capture; the driver memory of the graph objects grows in the first (real H200 starts:
    178 MiB for 54 graphs, 54 MiB for 18) and stays, so both windows count.
    """
    profiling = (
        "graph_profiling.total" if phase(report, "graph_profiling.total") else ("graph_profiling")
    )
    splits = [] if report.breakdown is None else report.breakdown.phases
    capture = next((s.outside_torch_bytes for s in splits if s.phase == "capture"), None)
    if capture is None:
        capture = _outside_growth(report, "capture")
    return _outside_growth(report, profiling) + max(capture, 0)


def _layer_counts(report: RunReport, dims: ModelDims | None) -> tuple[int, int]:
    """Decoder layers a target graph and a drafter graph hold: from the model's dimensions, else
    the KV-cache spec's layers (less the drafter's one) and one layer per drafter graph."""
    target = dims.num_layers if dims is not None else None
    drafter = dims.drafter_layers if dims is not None else None
    if target is None and report.kv_cache is not None and report.kv_cache.num_layers:
        target = report.kv_cache.num_layers - (1 if report.config.speculative_method else 0)
    return max(target or 1, 1), max(drafter or 1, 1)


def graph_layers(plan: CapturePlan, target_layers: int, drafter_layers: int) -> int:
    """Graphs x the decoder layers each holds, summed over a plan's runners."""
    return sum(
        r.graph_count * (drafter_layers if r.runner.startswith("draft") else target_layers)
        for r in plan.runners
    )


def graph_objects(
    report: RunReport, measured: int, g: CapturePlan, g2: CapturePlan, dims: ModelDims | None
) -> OwnerPrediction:
    """Graph objects outside PyTorch, charged per captured graph by the layers it holds.

    A graph's driver memory follows its kernel nodes, and those its layers: a one-layer EAGLE
    drafter's graph costs about 1/32 of a Llama-8B target graph (real H200 starts: 54 target
    graphs 934.8 MiB outside PyTorch, 18 graphs 810.8 MiB; adding 95 drafter graphs and 30
    target graphs +104 MiB, where a raw graph count predicts +412 MiB).
    """
    target_layers, drafter_layers = _layer_counts(report, dims)
    before = graph_layers(g, target_layers, drafter_layers)
    after = graph_layers(g2, target_layers, drafter_layers)
    factor = after / before if before else 1.0
    return OwnerPrediction(
        stage="capture",
        owner=GRAPH_OBJECTS,
        law="graph_count_x_layers",
        measured_bytes=measured,
        factor=factor,
        predicted_bytes=round(measured * factor),
        note=f"{before} -> {after} graph-layers ({target_layers} per target graph, "
        f"{drafter_layers} per drafter graph)",
    )
