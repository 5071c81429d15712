"""Who sized a start's KV cache: the plugin's field, else an older report's note, read once."""

from __future__ import annotations

from pathlib import Path

from memest.cli._reports import load_report
from memest.estimate import account

ROOT = Path(__file__).resolve().parents[3]
#: Written with the note "KV cache of this start sized by memest" (an apply start).
NOTED = ROOT / "tests/data/reports/call6.B_llama8b_s32_t2048.apply.report.rank0.json"
#: Older: only its measured record's note says "this start, KV sized by vllm: ...".
OLDER = ROOT / "tests/data/starts/call3.A_llama8b_s128_t4096.enable.report.rank0.json"


def test_an_older_report_is_read_from_its_note() -> None:
    report = load_report(NOTED)
    assert report.kv_sized_by is None
    assert account(report).kv_sized_by == "memest"


def test_the_oldest_reports_are_read_from_the_measured_record() -> None:
    report = load_report(OLDER)
    assert not any("sized by" in n for n in report.notes)
    assert account(report).kv_sized_by == "vllm"


def test_the_recorded_field_wins_over_any_note() -> None:
    report = load_report(NOTED).model_copy(update={"kv_sized_by": "memest-plan"})
    assert account(report).kv_sized_by == "memest-plan"


def test_a_report_that_does_not_say_has_none() -> None:
    report = load_report(NOTED)
    # Neither a note nor the measured record's note (the estimate records go with it) says.
    said = [n for n in report.notes if "sized by" not in n]
    report = report.model_copy(update={"notes": said, "estimate": None})
    assert account(report).kv_sized_by is None
