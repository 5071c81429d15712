"""The synthetic law per stage when G's owners carry names the synthetic program does not."""

from __future__ import annotations

from memest.estimate.whatif_synthetic import _stage_rows


def test_stage_total_moves_by_the_program_and_owners_keep_their_shares() -> None:
    measured = {("target.piecewise", "norm"): 24, ("target.piecewise", "mlp_act"): 40}
    at_g = {("target.piecewise", "compiled_piece"): 62}
    at_to = {("target.piecewise", "compiled_piece"): 22}
    rows = _stage_rows("target.piecewise", measured, at_g, at_to)
    assert sum(r.predicted_bytes for r in rows) == 64 + 22 - 62
    by_owner = {r.owner: r.predicted_bytes for r in rows}
    assert by_owner["mlp_act"] == round(40 * 24 / 64)
    assert {r.law for r in rows} == {"synthetic_trace"}


def test_a_stage_cannot_go_below_zero() -> None:
    rows = _stage_rows(
        "s", {("s", "a"): 10}, {("s", "compiled_piece"): 100}, {("s", "compiled_piece"): 0}
    )
    assert [r.predicted_bytes for r in rows] == [0]
