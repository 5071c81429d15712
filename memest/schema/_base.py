from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from memest.units import MAX_BYTES

SCHEMA_VERSION = "1"

Bytes = Annotated[int, Field(ge=-MAX_BYTES, le=MAX_BYTES)]
"""Signed byte count (a delta may be negative), within int64."""

NonNegativeBytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]


class MemestModel(BaseModel):
    """Base of every report model: unknown fields are an error, so a typo is named, not dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


__all__ = ["SCHEMA_VERSION", "Bytes", "Field", "MemestModel", "NonNegativeBytes"]
