"""The streaming JSON reader: the same values as json.loads at any chunking, compact columns,
json.loads's error positions, and a memory peak bounded by the input (tracemalloc, not timed)."""

from __future__ import annotations

import gc
import gzip
import json
import random
import tracemalloc
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memest.analysis import analyze
from memest.errors import SnapshotFormatError
from memest.files import InputFileError, gunzip_chunks
from memest.snapshot import FORMAT_NAME, dump_snapshot, load_snapshot, parse_snapshot
from memest.snapshot.stream import read_json
from memest.snapshot.tags import StageTag, format_tag


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def _plain(obj: Any) -> Any:
    """Arrays as lists, to compare with json.loads."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, array):
        return obj.tolist()
    return obj


def _synthetic(n_events: int, seed: int = 0) -> dict[str, Any]:
    """A valid snapshot shaped like a capture: large addresses and times, a few stacks and tags,
    allocations freed in turn, a segment now and then."""
    rng = random.Random(seed)
    tags = [""] + [
        format_tag(StageTag("capture", "target.full", 512 - 8 * i, "0,1", i + 1)) for i in range(8)
    ]
    cols: dict[str, list[int]] = {
        k: [] for k in ("action", "addr", "size", "stream", "time_us", "tag", "stack")
    }
    addr, t, live = 0x7F00_0000_0000, 1_700_000_000_000_000, []
    while len(cols["action"]) < n_events:
        tag = 1 + (len(cols["action"]) * 8) // n_events
        if rng.random() < 0.02:
            row = [3, addr, 2 << 20, 7, t, tag, rng.randrange(40)]
        elif live and rng.random() < 0.45:
            a, s = live.pop(rng.randrange(len(live)))
            row = [2, a, s, 7, t, tag, -1]
        else:
            size = rng.choice((512, 4096, 65536, 2 << 20))
            row = [0, addr, size, 7, t, tag, rng.randrange(40)]
            live.append((addr, size))
            addr += size + 512
        for name, value in zip(cols, row, strict=True):
            cols[name].append(value)
        t += rng.randrange(1, 50)
    return {
        "format": FORMAT_NAME,
        "version": 1,
        "source": {"synthetic": True},
        "frames": [[f"vllm/mod{i}.py", 10 + i, f"fn_{i}"] for i in range(60)],
        "stacks": [[rng.randrange(60) for _ in range(12)] for _ in range(40)],
        "tags": tags,
        "actions": ["alloc", "free_requested", "free_completed", "segment_alloc"],
        "events": cols,
        "segments": [],
        "windows": [],
        "phases": [],
    }


@pytest.mark.parametrize("chunk", [1, 3, 64, 1000, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_same_values_as_json_loads_at_any_chunking(chunk: int, indent: int | None) -> None:
    snap = _synthetic(300)
    snap["events"]["stream"][5] = -(2**63)  # a signed 64-bit column
    snap["extra"] = {"events": [1, 2], "n": 12345678901234567890, "s": "é\u2603"}
    data = json.dumps(snap, indent=indent, ensure_ascii=False).encode()
    got = read_json(_chunks(data, chunk), source="s")
    assert _plain(got) == json.loads(data)
    assert all(isinstance(col, array) for col in got["events"].values())


@pytest.mark.parametrize(
    ("values", "typecode"),
    [
        ([0, 1, 127], "b"),  # 1 byte: -128..127
        ([0, 128], "h"),  # 2 bytes
        ([-1, 32768], "i"),  # 4 bytes
        ([0, 2**31], "q"),  # 8 bytes, signed
        ([0, 2**63], "Q"),  # 8 bytes, unsigned only
    ],
)
def test_column_takes_the_narrowest_type(values: list[int], typecode: str) -> None:
    doc = json.dumps({"events": {"addr": values}}).encode()
    column = read_json(_chunks(doc, 4), source="s")["events"]["addr"]
    assert isinstance(column, array) and column.typecode == typecode
    assert column.tolist() == values


def test_column_no_64_bit_type_holds_is_a_list() -> None:
    values = [-1, 2**64 - 1]  # the stream column's range allows both
    column = read_json(iter([json.dumps({"events": {"stream": values}}).encode()]), source="s")
    assert column["events"]["stream"] == values


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1} x',
        '{"a" 1}',
        '{"a": 1,}',
        '{"a": [1, 2}',
        '{\n  "frames": [\n    [1, 2,,]\n  ]\n}',
        '{"events": {"action": [1]} "x": 1}',
        '{"a": "unterminated',
        "[1, 2",
    ],
)
@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_syntax_errors_name_the_place_json_loads_names(text: str, chunk: int) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    where = f"line {expected.value.lineno} column {expected.value.colno}"
    with pytest.raises(SnapshotFormatError, match="invalid or truncated JSON") as got:
        read_json(_chunks(text.encode(), chunk), source="s")
    assert where in str(got.value)


@pytest.mark.parametrize(
    "column",
    ["[1, 2,]", "[,1]", "[1,,2]", "[1 2]", "[1, 2", "[01]", "[-]", "[1, -]"],
)
@pytest.mark.parametrize("chunk", [1, 2, 4096])
def test_broken_integer_columns_are_refused(column: str, chunk: int) -> None:
    text = '{"events": {"action": ' + column + "}}"
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # the reference: none of these is JSON
    with pytest.raises(SnapshotFormatError, match="invalid or truncated JSON"):
        read_json(_chunks(text.encode(), chunk), source="s")


@pytest.mark.parametrize("column", ["[1.5]", "[true]", '["1"]', "[[1]]", "[null]", "[1e3]"])
def test_non_integer_columns_name_the_column(column: str) -> None:
    text = '{"events": {"size": ' + column + "}}"
    with pytest.raises(SnapshotFormatError, match=r"s\.events\.size: expected integers only"):
        read_json(iter([text.encode()]), source="s")


def test_a_number_without_end_is_refused_without_reading_on() -> None:
    def endless() -> Iterator[bytes]:
        yield b'{"events": {"addr": [1'
        while True:  # a reader that kept it all would never stop
            yield b"0" * 4096

    with pytest.raises(SnapshotFormatError, match="expected integers only"):
        read_json(endless(), source="s")


@pytest.mark.parametrize("chunk", [1, 4096])
def test_invalid_utf8_names_the_byte_offset(chunk: int) -> None:
    data = b'{"tags": ["ok", "\xe2\x98\x83", "\xff"]}'
    with pytest.raises(SnapshotFormatError, match=r"not UTF-8 text \(invalid byte at offset 24\)"):
        read_json(_chunks(data, chunk), source="s")


def test_loaded_snapshot_dumps_and_analyzes_as_before(tmp_path: Path) -> None:
    snap = _synthetic(2000)
    reference = analyze(json.loads(json.dumps(snap)))  # lists throughout, as json.loads gives
    path = tmp_path / "s.json.gz"
    dump_snapshot(snap, path)
    loaded = load_snapshot(path)
    assert analyze(loaded) == reference
    again = tmp_path / "again.json"
    dump_snapshot(loaded, again)  # compact columns write as JSON lists
    assert json.loads(again.read_text()) == json.loads(gzip.decompress(path.read_bytes()))
    assert _plain(parse_snapshot(again.read_bytes())) == _plain(loaded)


def test_load_and_analyze_peak_stays_under_twice_the_input(tmp_path: Path) -> None:
    """json.loads alone held about six times the text (measured 6.06x on a real history); the
    stream reader keeps about one. 2x leaves room for the analysis's own tables."""
    path = tmp_path / "s.json.gz"
    dump_snapshot(_synthetic(80_000), path)
    n_bytes = len(gzip.decompress(path.read_bytes()))  # the JSON text
    gc.collect()
    tracemalloc.start()
    try:
        analyze(load_snapshot(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"peak {peak:,} B for {n_bytes:,} B of JSON ({peak / n_bytes:.2f}x)")
    assert peak < 2 * n_bytes, f"peak {peak:,} B for {n_bytes:,} B of JSON"


def test_smallest_text_per_value_still_bounded(tmp_path: Path) -> None:
    """Hostile shape: every event value a single digit (2 bytes of text), the fewest bytes a
    value can take; each goes into 1 byte."""
    n = 100_000
    snap = _synthetic(1)
    snap["events"] = {k: [0] * n for k in snap["events"]}
    snap["events"]["stack"] = [-1] * n
    path = tmp_path / "zeros.json"
    dump_snapshot(snap, path)
    n_bytes = path.stat().st_size
    gc.collect()
    tracemalloc.start()
    try:
        analyze(load_snapshot(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * n_bytes, f"peak {peak:,} B for {n_bytes:,} B of JSON"


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_gzip_members_and_padding_inflate_across_chunks(chunk: int) -> None:
    one, two = b'{"a": [1, 2, 3]' * 50, b', "b": 4}'
    data = gzip.compress(one) + gzip.compress(two) + b"\0" * 9
    pieces = gunzip_chunks(_chunks(data, chunk), limit=1 << 20, source="s")
    assert b"".join(pieces) == gzip.decompress(data) == one + two


@pytest.mark.parametrize("chunk", [1, 4096])
def test_truncated_gzip_and_output_over_the_limit_are_refused(chunk: int) -> None:
    data = gzip.compress(b"x" * 10_000)
    with pytest.raises(InputFileError, match="truncated gzip"):
        b"".join(gunzip_chunks(_chunks(data[:-12], chunk), limit=1 << 20, source="s"))
    with pytest.raises(InputFileError, match="decompresses to more than"):
        b"".join(gunzip_chunks(_chunks(data, chunk), limit=9_999, source="s"))
