"""The one place that parses and formats byte counts. Bytes are ``int`` everywhere else."""

from __future__ import annotations

import re

from memest.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

MAX_BYTES = 2**63 - 1
"""Largest byte count memest accepts anywhere (int64, what the service's database stores)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": 1000,
    "kib": KiB,
    "m": MiB,
    "mb": 1000**2,
    "mib": MiB,
    "g": GiB,
    "gb": 1000**3,
    "gib": GiB,
    "t": TiB,
    "tb": 1000**4,
    "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([-+]?\d{1,30}(?:\.\d{1,30})?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, *, field: str = "size", signed: bool = False) -> int:
    """Parse ``"6GiB"``, ``"0.25 GiB"``, ``"512MiB"`` or ``"1024"`` into bytes.

    Sizes are limits and margins, so a negative one is refused unless ``signed``; anything
    beyond ``MAX_BYTES`` is refused too (no real memory is that large).

    Raises:
        ConfigError: the text is not a number with a known unit, or is out of range.
    """
    m = _SIZE_RE.match(text)
    if not m:
        raise ConfigError(field, text, "expected a number with an optional unit such as 6GiB")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ConfigError(field, text, f"unknown unit {m.group(2)!r} (use B, KiB, MiB, GiB, TiB)")
    value = int(round(float(number) * _UNITS[unit]))
    if value < 0 and not signed:
        raise ConfigError(field, text, "must not be negative")
    if abs(value) > MAX_BYTES:
        raise ConfigError(field, text, "larger than any real memory (limit 2**63-1 bytes)")
    return value


def gib(n_bytes: int | float) -> float:
    return float(n_bytes) / GiB


def mib(n_bytes: int | float) -> float:
    return float(n_bytes) / MiB


def fmt_gib(n_bytes: int | float, digits: int = 3, *, signed: bool = False) -> str:
    """Format bytes as GiB with a fixed number of digits (the seed's tables use 3)."""
    value = gib(n_bytes)
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def fmt_bytes(n_bytes: int | float) -> str:
    """Human form with a binary unit: ``1.50 GiB``, ``310.0 MiB``, ``512 B``."""
    n = float(n_bytes)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if n >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    if n >= KiB:
        return f"{sign}{n / KiB:.1f} KiB"
    return f"{sign}{int(n)} B"


#: What a table cell shows for a figure the report does not have.
MISSING = "–"


def gib_cell(n_bytes: int | None, digits: int = 3, *, signed: bool = False) -> str:
    """A table cell in GiB (``fmt_gib``), or ``MISSING``."""
    return MISSING if n_bytes is None else fmt_gib(n_bytes, digits, signed=signed)


def count_cell(value: int | None) -> str:
    """A count with thousands separators, or ``MISSING``."""
    return MISSING if value is None else f"{value:,}"


def ratio_cell(value: float | None) -> str:
    """A ratio such as ``1.25×``, or ``MISSING``."""
    return MISSING if value is None else f"{value:.2f}×"


def kv_cache_memory_flag(n_bytes: int) -> str:
    """vLLM's flag that fixes one GPU's KV cache at ``n_bytes``, as every surface prints it."""
    return f"--kv-cache-memory-bytes={n_bytes}"


def concurrency_text(value: float | None, max_model_len: int | None) -> str:
    """Max concurrency as every surface words it: ``204.11× at max_model_len 4,096``."""
    return f"{ratio_cell(value)} at max_model_len {count_cell(max_model_len)}"
