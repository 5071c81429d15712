from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

SCHEMA_VERSION = "1"

Bytes = int
"""Signed byte count (a delta may be negative)."""

NonNegativeBytes = NonNegativeInt


class MemestModel(BaseModel):
    """Base of every report model: unknown fields are an error, so a typo is named, not dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


__all__ = ["SCHEMA_VERSION", "Bytes", "Field", "MemestModel", "NonNegativeBytes"]
