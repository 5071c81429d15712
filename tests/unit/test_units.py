from __future__ import annotations

import pytest

from memest.errors import ConfigError
from memest.units import GiB, MiB, fmt_bytes, fmt_gib, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6GiB", 6 * GiB),
        ("0.25 GiB", GiB // 4),
        ("512MiB", 512 * MiB),
        ("1024", 1024),
        ("1gb", 10**9),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "6 parsecs", "1.2.3G"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="max_graph_pool"):
        parse_bytes(text, field="max_graph_pool")


def test_format() -> None:
    assert fmt_gib(int(10.525 * GiB)) == "10.525"
    assert fmt_gib(-int(0.5 * GiB), signed=True) == "-0.500"
    assert fmt_bytes(310 * MiB) == "310.0 MiB"
    assert fmt_bytes(512) == "512 B"
