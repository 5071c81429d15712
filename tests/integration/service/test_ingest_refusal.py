"""A RunReport the service refuses: one line naming its first ten errors, the first as the field."""

from __future__ import annotations

import json

import pytest

from memest.service.errors import BadRequest
from memest.service.ingest import parse_report


def test_a_report_wrong_in_twelve_places_names_the_first_ten() -> None:
    body = {"run_id": "r", "model": "m", "config": {"model": "m"}, "capture_plans": [1] * 12}
    with pytest.raises(BadRequest) as exc:
        parse_report(json.dumps(body).encode())
    why = "Input should be a valid dictionary or instance of CapturePlan"
    named = "; ".join(f"capture_plans.{i}: {why}" for i in range(10))
    assert exc.value.message == f"invalid RunReport: {named}"
    assert exc.value.field == "capture_plans.0"


def test_a_field_of_the_wrong_type_is_named() -> None:
    with pytest.raises(BadRequest) as exc:
        parse_report(json.dumps({"run_id": 5, "model": "m", "config": {"model": "m"}}).encode())
    assert exc.value.message == "invalid RunReport: run_id: Input should be a valid string"
    assert exc.value.field == "run_id"
