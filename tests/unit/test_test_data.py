"""Tests read their inputs from tests/data, not from reports/ (measured data the lab rewrites),
except the few whose purpose is reports/ itself, each named here with why."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A path into reports/vllm/raw written in code: "reports/vllm/raw..." or "reports" / "vllm" / "raw".
RAW_PATH = re.compile(
    r"""["']reports/vllm/raw|["']reports["']\s*/\s*["']vllm["']\s*/\s*["']raw["']"""
)
READS_REPORTS = {
    # the what-if's accuracy on the committed grids of calls 11 and 14 (a 0.6 MB history and six
    # starts): the same measured truth reports/vllm/whatif.json publishes
    "tests/integration/test_whatif_real_grids.py",
    # lab/preflight_check.py's own input is the committed records and the calibration's starts
    "tests/unit/lab/test_preflight_check.py",
    # owners on call 12's whole MLA history: a 1.6 MB gzip, over tests/data's 1 MiB a file
    "tests/unit/analysis/test_mla_owners.py",
    # the what-if replayed through that same MLA history (the 1.6 MB gzip)
    "tests/integration/test_golden_whatif_mla_replay.py",
    # the demo's packaged starts must be the committed reports, byte for byte
    "tests/integration/service/test_demo.py",
}


def test_tests_read_copies_under_tests_data() -> None:
    readers = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("*.py")
        if p != Path(__file__).resolve() and RAW_PATH.search(p.read_text())
    }
    assert readers - READS_REPORTS == set()


def test_no_test_data_file_is_over_a_mebibyte() -> None:
    large = [
        p for p in (ROOT / "tests/data").rglob("*") if p.is_file() and p.stat().st_size > 1 << 20
    ]
    assert large == []
