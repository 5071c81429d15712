from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from memest.errors import ConfigError, DoesNotFitError, ReportFormatError
from memest.estimate import law_for, what_if
from memest.estimate.whatif import pool_predictions
from memest.schema import RunReport
from memest.units import GiB, MiB

from .conftest import PAGE, PLAN_G2  # noqa: TID252

Factory = Callable[[], dict[str, Any]]

#: The hand-built start's KV budget (conftest.report_dict), term by term: the requested 90 GiB
#: less the weights (16 GiB allocated over the weights phase), the activation headroom (profile
#: run's allocated peak 19 GiB less the 16 GiB it left), outside PyTorch (1.25 GiB of device use
#: above the final reservation), the graph pools (2 GiB of capture growth), runner buffers
#: (0.5 GiB the KV allocation added beyond its 30,000 pages) and the profiling residue (64 MiB
#: left allocated between weights and KV allocation). No baseline, MLA term or margin.
KV_BUDGET_G = 90 * GiB - (16 * GiB + 3 * GiB + 5 * GiB // 4 + 2 * GiB + GiB // 2 + 64 * MiB)
#: G' pool rows (test_per_owner_prediction): aux 150 MiB x 31/15 = 310 MiB, gemm workspace
#: 160 MiB, unattributed 20 MiB, indexer fp32 800 MiB, bf16 400 MiB, attn output 20 MiB.
POOL_TO = (310 + 160 + 20 + 800 + 400 + 20) * MiB
#: Graph objects (not pool memory) grow from 64 MiB with graphs x layers: 194 under G, 256 under G'.
OBJECTS_TO = round(64 * MiB * (8 * 32) / (6 * 32 + 2 * 1))
#: Under G' the 2 GiB of pools give way to POOL_TO, and the objects' growth comes off too.
KV_BUDGET_G2 = KV_BUDGET_G + 2 * GiB - POOL_TO - (OBJECTS_TO - 64 * MiB)


def test_laws() -> None:
    assert law_for("indexer_logits_fp32") == "widest_full_rows_x_context"
    assert law_for("aux_hidden_states") == "sum_piecewise_tokens"
    assert law_for("draft_logits") == "widest_draft_rows_x_vocab"
    assert law_for("graph_objects") == "graph_count_x_layers"
    assert law_for("moe_workspace") == "widest_tokens"
    assert law_for("unattributed:foo.py:bar") == "widest_tokens"
    assert law_for("kv_cache") == "constant"


def test_per_owner_prediction(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    result = what_if(report, PLAN_G2)
    got = {(p.stage, p.owner): p.predicted_bytes for p in result.owners}
    assert got == {
        ("target.piecewise", "aux_hidden_states"): round(150 * MiB * 31 / 15),
        ("target.piecewise", "gemm_workspace"): 160 * MiB,
        ("target.piecewise", "unattributed:target.piecewise"): 20 * MiB,
        ("target.full", "indexer_logits_fp32"): 800 * MiB,
        ("target.full", "indexer_logits_bf16"): 400 * MiB,
        ("target.full", "attn_output"): 20 * MiB,
        ("draft.block.full", "draft_logits"): 0,  # G' captures no drafter graphs
        # Graph objects by graphs x layers: G holds 6 target graphs of 32 layers (the KV spec's)
        # and 2 one-layer drafter graphs, G' 8 target graphs.
        ("capture", "graph_objects"): round(64 * MiB * (8 * 32) / (6 * 32 + 2 * 1)),
    }
    assert result.graph_pool_bytes_from == 2 * GiB
    # G' keeps only the pool rows above: 310 + 160 + 20 + 800 + 400 + 20 MiB
    assert result.graph_pool_bytes_to == POOL_TO
    assert result.dominant_owner == "draft_logits"
    assert result.dominant_change_bytes == -1198 * MiB

    assert result.kv_budget_bytes_from == KV_BUDGET_G
    assert result.kv_budget_bytes_to == KV_BUDGET_G2
    assert result.kv_tokens_to == (KV_BUDGET_G2 // PAGE) * 16


def test_grid_from_memest_plan_inputs(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    grid = {
        "sizing": "vllm-0.33.0",
        "sm100": False,
        "max_num_seqs": 512,
        "max_num_batched_tokens": 8192,
        "spec_method": "dspark",
        "num_speculative_tokens": 3,
        "max_cudagraph_capture_size": 1024,
    }
    # The pool rows alone: at this grid the synthetic start's non-KV memory (651 GiB) would not
    # fit its 90 GiB budget, which what_if refuses.
    owners, _ = pool_predictions(report, grid)
    aux = next(p for p in owners if p.owner == "aux_hidden_states")
    # vLLM 0.33.0's capture sizes up to 1024: 1, 2, 4, then 8..248 by 8 (31 sizes), then
    # 256..1024 by 16 (49 sizes): 83 sizes summing to 7 + 8 x 496 + 49 x 640 = 35,335 tokens.
    # G's PIECEWISE sizes sum to 15.
    assert 7 + 8 * sum(range(1, 32)) + sum(range(256, 1025, 16)) == 35_335
    assert aux.factor == pytest.approx(35_335 / 15)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda g: g["runners"][0].update(graph_count=9), "grid.runners[0].graph_count"),
        (lambda g: g["runners"][0].update(sizes=[4, 2, 1, 8, 16]), "grid.runners[0].sizes"),
        (lambda g: g.update(total_graphs=1), "grid.total_graphs"),
        (lambda g: g["runners"][0].update(widest_tokens=-1), "grid.runners.0.widest_tokens"),
        (lambda g: g.update(sizing="other"), "grid.sizing"),
    ],
)
def test_invalid_grid_is_named(
    make_report: Factory, mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    import copy

    grid = copy.deepcopy(PLAN_G2)
    mutate(grid)
    with pytest.raises(ConfigError) as exc:
        what_if(RunReport.model_validate(make_report()), grid)
    assert exc.value.field == field


def test_plan_input_error_is_named(make_report: Factory) -> None:
    with pytest.raises(ConfigError, match="max_num_seqs"):
        what_if(
            RunReport.model_validate(make_report()),
            {"sm100": False, "max_num_seqs": 0, "max_num_batched_tokens": 8192},
        )


def test_report_without_plan_is_named(make_report: Factory) -> None:
    data = make_report()
    data["capture_plans"] = []
    with pytest.raises(ReportFormatError, match="capture_plans is empty"):
        what_if(RunReport.model_validate(data), PLAN_G2)


def test_retained_outputs_scale_from_live_bytes(make_report: Factory) -> None:
    data = make_report()
    # 160 MiB of aux outputs stay live; 10 MiB of them fit in space freed by workspaces under G.
    data["breakdown"]["retained"] = [
        {"stage": "target.piecewise", "owner": "aux_hidden_states", "bytes": 160 * MiB}
    ]
    result = what_if(RunReport.model_validate(data), PLAN_G2)
    aux = next(p for p in result.owners if p.owner == "aux_hidden_states")
    assert aux.measured_bytes == 150 * MiB
    assert aux.predicted_bytes == round(160 * MiB * 31 / 15)
    assert "retained" in aux.note


def test_activation_headroom_scales_with_max_num_batched_tokens(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    same = what_if(report, PLAN_G2)
    wider = what_if(report, {**PLAN_G2, "max_num_batched_tokens": 16_384})
    # the profile run's 3 GiB of activations come from 8,192-token rows: 6 GiB at 16,384
    assert same.kv_budget_bytes_to == KV_BUDGET_G2
    assert wider.kv_budget_bytes_to == KV_BUDGET_G2 - 3 * GiB
    assert any("max_num_batched_tokens 8192 -> 16384" in n for n in wider.notes)
    assert not any("max_num_batched_tokens" in n for n in same.notes)


def test_a_grid_whose_non_kv_memory_fills_the_budget_is_refused(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    grid = {"sizing": "vllm-0.33.0", "sm100": False, "max_num_seqs": 512}
    grid |= {"max_num_batched_tokens": 8192, "spec_method": "dspark", "num_speculative_tokens": 3}
    with pytest.raises(DoesNotFitError, match=r"does not fit: non-KV .* GiB > budget 90.000 GiB"):
        what_if(report, {**grid, "max_cudagraph_capture_size": 1024})
