"""memest.errors: pydantic's errors as (field, message, value), one or the first N."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from memest.errors import FieldError, field_errors, first_error


class _Inner(BaseModel):
    size: int


class _Outer(BaseModel):
    name: str
    runners: list[_Inner]


def _refusal(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as exc:
        _Outer.model_validate(data)
    return exc.value


def test_the_first_error_names_its_dotted_location_and_value() -> None:
    exc = _refusal({"name": "a", "runners": [{"size": 1}, {"size": "x"}]})
    assert first_error(exc) == FieldError(
        "runners.1.size",
        "Input should be a valid integer, unable to parse string as an integer",
        "x",
    )


def test_the_first_n_errors_in_pydantics_order() -> None:
    data = {"runners": [{"size": "x"}, {}, {"size": "y"}]}
    exc = _refusal(data)
    got = field_errors(exc, 3)
    assert [e.field for e in got] == ["name", "runners.0.size", "runners.1.size"]
    assert got[0] == FieldError("name", "Field required", data)  # the object missing it
    assert got[2] == FieldError("runners.1.size", "Field required", {})
    assert len(field_errors(exc, 10)) == 4  # every error when fewer than asked
    assert field_errors(exc, 1) == [first_error(exc)]
