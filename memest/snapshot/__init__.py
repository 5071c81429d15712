"""Allocator snapshots: memest's JSON form, format detection, and safe loading of torch pickles."""

from memest.snapshot._unpickle import safe_loads
from memest.snapshot.convert import from_torch, scrub_path, scrub_roots_default, to_torch
from memest.snapshot.format import FORMAT_NAME, FORMAT_VERSION, Snapshot, empty_snapshot, validate
from memest.snapshot.load import (
    detect_format,
    dump_snapshot,
    load_snapshot,
    parse_snapshot,
    to_memest,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Snapshot",
    "detect_format",
    "dump_snapshot",
    "empty_snapshot",
    "from_torch",
    "load_snapshot",
    "parse_snapshot",
    "safe_loads",
    "scrub_path",
    "scrub_roots_default",
    "to_memest",
    "to_torch",
    "validate",
]
