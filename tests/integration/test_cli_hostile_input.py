"""Hostile input to every CLI loader: exit 2, one line on stderr, no traceback, bounded memory.

Each case runs ``memest`` in a child process under an address-space limit (so a regression
fails instead of exhausting the machine) and reads the child's peak RSS (VmHWM) as it exits.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memest.snapshot import empty_snapshot
from tests.unit.estimate.conftest import report_dict

PEAK_RSS_LIMIT_BYTES = 200 * 1024 * 1024
"""Peak RSS any hostile case may reach (an idle `memest` process holds about 40 MiB)."""

ADDRESS_SPACE_LIMIT_BYTES = 2 * 1024**3
SMALL_INPUT_LIMIT = "32MiB"
"""MEMEST_MAX_INPUT_BYTES for the cases that test the configurable snapshot cap."""

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="peak RSS is read from Linux /proc"
)


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    peak_rss_bytes: int


# Runs memest under the limit and, on the way out, records the process's peak RSS (VmHWM, kept
# per address space, so unlike ru_maxrss it does not count the pytest process it was forked from).
LIMITED_RUN = """
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2)
try:
    from memest.cli import main
    code = main(sys.argv[3:])
finally:
    status = Path("/proc/self/status").read_text()
    peak = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    Path(sys.argv[2]).write_text(peak)
sys.exit(code)
"""


def run_memest(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> Outcome:
    """Run ``memest ARGS`` in a child limited to ADDRESS_SPACE_LIMIT_BYTES; measure its RSS."""
    child_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    peak_path = tmp_path / "peak-rss-kib.txt"
    limit = str(ADDRESS_SPACE_LIMIT_BYTES)
    proc = subprocess.run(
        [sys.executable, "-c", LIMITED_RUN, limit, str(peak_path), *args],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=child_env,
        cwd=tmp_path,
        check=False,
    )
    return Outcome(
        code=proc.returncode,
        stdout=proc.stdout.decode(errors="replace"),
        stderr=proc.stderr.decode(errors="replace"),
        peak_rss_bytes=int(peak_path.read_text()) * 1024,
    )


def assert_refused(outcome: Outcome, *needles: str) -> str:
    lines = outcome.stderr.strip().splitlines()
    assert outcome.code == 2, outcome.stderr
    assert len(lines) == 1, outcome.stderr
    assert "Traceback" not in outcome.stderr
    assert outcome.peak_rss_bytes < PEAK_RSS_LIMIT_BYTES, outcome.peak_rss_bytes
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- hostile files -----------------------------------------------------------------------------


def dev_zero(tmp_path: Path, name: str) -> Path:
    link = tmp_path / name
    link.symlink_to("/dev/zero")
    return link


def fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def non_utf8(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(b'{"model": "\xff\xfe caf\xe9"}')
    return path


def deep_json(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text("[" * 200_000 + "]" * 200_000)
    return path


def huge_int_json(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text('{"rules": [], "x": ' + "9" * 100_000 + "}")
    return path


Maker = Callable[[Path, str], Path]

FILE_CASES: dict[str, tuple[Maker, str]] = {
    "dev_zero": (dev_zero, "not a regular file"),
    "fifo": (fifo, "not a regular file"),
    "non_utf8": (non_utf8, "not UTF-8"),
    "deep": (deep_json, "nested too deeply"),
    "huge_int": (huge_int_json, "too many digits"),
}

# Each loader, as the command line reaches it: (name, args with {} for the hostile file).
LOADERS: list[tuple[str, list[str]]] = [
    ("snapshot", ["analyze", "{}"]),
    ("report_check", ["check", "{}", "--max-graph-pool", "1GiB"]),
    ("report_estimate", ["estimate", "--from", "{}"]),
    ("report_render", ["report", "{}", "--out", "out"]),
    ("report_baseline", ["check", "GOOD_REPORT", "--baseline", "{}", "--max-kv-drop", "0.1"]),
    ("rules", ["analyze", "GOOD_SNAPSHOT", "--rules", "{}"]),
    ("phases", ["analyze", "GOOD_SNAPSHOT", "--phases", "{}"]),
    ("grid", ["estimate", "--from", "GOOD_REPORT", "--grid", "{}"]),
    ("grid_snapshot", ["estimate", "--from", "GOOD_REPORT", "--grid", "{}", "--snapshot", "{}"]),
    ("run_dir", ["analyze", "--run", "RUN_DIR"]),
]


def good_files(tmp_path: Path) -> dict[str, str]:
    report = tmp_path / "good-report.json"
    report.write_text(json.dumps(report_dict()))
    snapshot = tmp_path / "good-snapshot.json"
    snapshot.write_text(json.dumps(empty_snapshot()))
    return {"GOOD_REPORT": str(report), "GOOD_SNAPSHOT": str(snapshot)}


def loader_args(template: list[str], hostile: Path, tmp_path: Path) -> list[str]:
    goods = good_files(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    goods["RUN_DIR"] = str(run_dir)
    if not (run_dir / "report.rank0.json").exists():
        (run_dir / "report.rank0.json").symlink_to(hostile)
    args = [goods.get(a, a) for a in template]
    if template[-1] == "{}" and template[:1] == ["estimate"] and "--snapshot" in template:
        args[args.index("--grid") + 1] = json.dumps({"max_num_seqs": 8})  # hostile snapshot
    return [str(hostile) if a == "{}" else a for a in args]


@pytest.mark.parametrize("case", sorted(FILE_CASES))
@pytest.mark.parametrize(("loader", "template"), LOADERS, ids=[name for name, _ in LOADERS])
def test_every_loader_refuses_hostile_files(
    tmp_path: Path, loader: str, template: list[str], case: str
) -> None:
    make, reason = FILE_CASES[case]
    hostile = make(tmp_path, f"hostile-{case}.json")
    line = assert_refused(run_memest(loader_args(template, hostile, tmp_path), tmp_path))
    assert reason in line, line


# --- snapshots: gzip, pickle, values -----------------------------------------------------------


def gzip_of(chunks: int, chunk: bytes, prefix: bytes = b"") -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(prefix)]
    parts += [packer.compress(chunk) for _ in range(chunks)]
    return b"".join([*parts, packer.flush()])


def test_gzip_bomb_of_zeros_is_refused_before_inflating(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip_of(1024, bytes(1 << 20)))  # 1 GiB of zeros in about 1 MiB
    assert bomb.stat().st_size < 2 << 20
    assert_refused(run_memest(["analyze", str(bomb)], tmp_path), "unknown snapshot format")


def test_gzip_bomb_is_capped_while_streaming(tmp_path: Path) -> None:
    prefix = b'{"format": "memest.allocator_snapshot", "pad": "'
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip_of(256, b" " * (1 << 20), prefix))  # 256 MiB of JSON-looking text
    env = {"MEMEST_MAX_INPUT_BYTES": SMALL_INPUT_LIMIT}
    line = assert_refused(run_memest(["analyze", str(bomb)], tmp_path, env), "32.0 MiB limit")
    assert "MEMEST_MAX_INPUT_BYTES" in line


def test_oversized_plain_snapshot_is_refused_by_size(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as handle:
        handle.truncate(64 << 20)  # sparse: 64 MiB of size, no disk
    env = {"MEMEST_MAX_INPUT_BYTES": SMALL_INPUT_LIMIT}
    assert_refused(run_memest(["analyze", str(path)], tmp_path, env), "larger than")


def test_bad_input_limit_setting_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(empty_snapshot()))
    env = {"MEMEST_MAX_INPUT_BYTES": "-1GiB"}
    assert_refused(run_memest(["analyze", str(path)], tmp_path, env), "MEMEST_MAX_INPUT_BYTES")


def test_gzip_within_the_cap_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.json.gz"
    path.write_bytes(gzip.compress(json.dumps(empty_snapshot()).encode()))
    outcome = run_memest(["analyze", str(path), "--json"], tmp_path)
    assert outcome.code == 0, outcome.stderr
    assert json.loads(outcome.stdout)["graph_pool_growth_bytes"] == 0


# Protocol-0 pickles calling bytearray(size): 48 bytes asking for 2 GiB, and for 2**64 bytes.
BYTEARRAY_2GIB = b"c__builtin__\nbytearray\n(I2147483648\ntR."
BYTEARRAY_2_64 = b"c__builtin__\nbytearray\n(L18446744073709551616L\ntR."


@pytest.mark.parametrize("payload", [BYTEARRAY_2GIB, BYTEARRAY_2_64], ids=["2GiB", "2**64"])
def test_pickled_bytearray_size_is_refused(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(payload)
    assert len(payload) < 60
    assert_refused(run_memest(["analyze", str(path)], tmp_path), "bytearray(size)")


def test_pickle_of_shared_lists_is_refused(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 1, "frames": []}
    trace = [entry] * 20_000  # one object, referenced 20,000 times
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace] * 20_000}, 4))
    assert path.stat().st_size < 200_000
    assert_refused(run_memest(["analyze", str(path)], tmp_path), "repeats shared entries")


def test_deeply_nested_pickle_is_refused(tmp_path: Path) -> None:
    depth = 100_000
    # Written opcode by opcode (pickle.dumps itself would recurse too deeply): a dict whose
    # "segments" is a list nested `depth` times (EMPTY_LIST x depth, then APPEND x depth-1).
    nested = b"]" * depth + b"a" * (depth - 1)
    key = b"\x8c\x08segments"
    traces = b"\x8c\x0ddevice_traces]s"
    path = tmp_path / "deep.pickle"
    path.write_bytes(b"\x80\x04}" + key + nested + b"s" + traces + b".")
    assert_refused(run_memest(["analyze", str(path)], tmp_path))


def snapshot_with(**events: list[Any]) -> dict[str, Any]:
    snap = empty_snapshot()
    snap["actions"] = ["alloc"]
    row = {"action": 0, "addr": 4096, "size": 512, "stream": 0, "time_us": 1, "tag": 0}
    snap["events"] = {name: [value] for name, value in row.items()} | {"stack": [-1]}
    snap["events"].update(events)
    return snap


@pytest.mark.parametrize(
    ("events", "named"),
    [
        ({"size": [-512]}, "events.size"),
        ({"size": [512.5]}, "events.size"),
        ({"size": [2**200]}, "events.size"),
        ({"addr": ["0x1000"]}, "events.addr"),
        ({"time_us": [None]}, "events.time_us"),
    ],
    ids=["negative", "float", "huge", "string", "null"],
)
def test_snapshot_values_are_checked(
    tmp_path: Path, events: dict[str, list[Any]], named: str
) -> None:
    for name, writer in (("snap.json", json.dumps), ("snap.pickle", pickle.dumps)):
        data = snapshot_with(**events)
        path = tmp_path / name
        path.write_bytes(writer(data) if name.endswith("pickle") else writer(data).encode())
        assert_refused(run_memest(["analyze", str(path)], tmp_path), named)


def test_torch_segment_with_negative_size_is_refused(tmp_path: Path) -> None:
    torch_like = {
        "segments": [{"address": 4096, "total_size": -5, "segment_pool_id": (0, 0), "blocks": []}],
        "device_traces": [[]],
    }
    path = tmp_path / "torch.pickle"
    path.write_bytes(pickle.dumps(torch_like, 2))
    assert_refused(run_memest(["analyze", str(path)], tmp_path), "total_size")


# --- reports and size arguments ----------------------------------------------------------------


def test_size_beyond_any_memory_in_a_report_is_refused(tmp_path: Path) -> None:
    data = report_dict()
    data["breakdown"]["graph_pool_growth_bytes"] = 2**200
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    outcome = run_memest(["check", str(path), "--max-graph-pool", "1GiB"], tmp_path)
    assert_refused(outcome, "graph_pool_growth_bytes")
    assert "e+51" not in outcome.stdout


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--max-graph-pool", "-1GiB", "must not be negative"),
        ("--max-estimate-error", "-0.5GiB", "must not be negative"),
        ("--max-total-added", "99999999999999999999TiB", "larger than any real memory"),
        ("--max-graph-pool", "1" * 400 + "GiB", "expected a number"),
    ],
)
def test_size_arguments_are_checked(tmp_path: Path, flag: str, value: str, named: str) -> None:
    report = good_files(tmp_path)["GOOD_REPORT"]
    assert_refused(run_memest(["check", report, f"{flag}={value}"], tmp_path), flag, named)


def test_inline_grid_nested_too_deeply(tmp_path: Path) -> None:
    report = good_files(tmp_path)["GOOD_REPORT"]
    grid = '{"a": ' + "[" * 30_000 + "]" * 30_000 + "}"  # within the kernel's argument limit
    outcome = run_memest(["estimate", "--from", report, "--grid", grid], tmp_path)
    assert_refused(outcome, "--grid", "nested too deeply")


def test_absurd_report_figure_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memest.cli import main

    data = report_dict()
    data["kv_cache"]["head_size"] = 10**30  # every derived byte figure leaves int64
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert main(["estimate", "--from", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "input leads to an invalid" in err
