"""memest's exception hierarchy.

Every error raised on bad input names the field or file and the offending value, so that the CLI
can print one line and the service can answer 4xx with the field named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pydantic import ValidationError


class MemestError(Exception):
    """Base class of every memest error."""


class ConfigError(MemestError, ValueError):
    """A capture-plan or estimator configuration is invalid.

    Attributes:
        field: the configuration field at fault (dotted for nested values).
        value: the offending value, as given.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


class DoesNotFitError(ConfigError):
    """A configuration leaves no room for the KV cache (its message starts "does not fit:").

    A ConfigError, so surfaces that answer bad configurations (CLI exit 2, service 422) answer
    it too; ``field`` names the setting that sizes the budget.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        MemestError.__init__(self, reason)


class SnapshotFormatError(MemestError, ValueError):
    """An allocator snapshot (pickle or JSON) is truncated, unsafe or not in a known format."""


class ReportFormatError(MemestError, ValueError):
    """A RunReport is missing data, or has another schema version."""


class InvariantError(MemestError):
    """An accounting identity does not hold (for example trigger rows not summing to pool growth)."""


class CommandError(MemestError):
    """A CLI command failed; printed as one line on stderr, exit with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        self.exit_code = exit_code
        super().__init__(message)


class FieldError(NamedTuple):
    """The first thing pydantic refuses in a value: where, why, and the value it read."""

    field: str  #: dotted location ("runners.0.sizes"); "" when pydantic names none
    message: str
    value: object


def field_errors(exc: ValidationError, limit: int) -> list[FieldError]:
    """The first ``limit`` of a pydantic ValidationError's errors, each as (field, message, value),
    for a surface that names several in one line (the service's refusal of a RunReport).
    Never empty: without errors, one FieldError with no field and the exception's text."""
    errors = exc.errors(include_url=False)[:limit]
    if not errors:
        return [FieldError("", str(exc), None)]
    return [
        FieldError(
            ".".join(str(p) for p in error.get("loc", ())),
            str(error.get("msg", "invalid")),
            error.get("input"),
        )
        for error in errors
    ]


def first_error(exc: ValidationError) -> FieldError:
    """The first of a pydantic ValidationError's errors, as every surface names it in one line
    (the CLI's exit 2, the service's 422, a core ConfigError)."""
    return field_errors(exc, 1)[0]
