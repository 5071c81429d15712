"""History compares like with like: one series per configuration and KV cache element type,
legends that tell look-alike configurations apart, a look per series, pages of runs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from memest.builds.history import history, history_pages, history_window
from memest.reporters.plots_history import (
    DISTINCT_SERIES,
    config_legends,
    series_color,
    series_marker,
)
from memest.reporters.svg import BAD_COLOR
from memest.schema import RunReport

STARTS = Path(__file__).parents[3] / "tests" / "data" / "starts"
S_APPLY = STARTS / "call9.S_llama8b_s128_t4096.apply.report.rank0.json"


def _start() -> RunReport:
    return RunReport.model_validate_json(S_APPLY.read_text())


def _copy(base: RunReport, i: int, **update: object) -> RunReport:
    return base.model_copy(
        update={
            "run_id": f"run-{i}",
            "report_id": f"{i:032x}",
            "created_at": base.created_at + timedelta(minutes=i),
            **update,
        }
    )


def test_an_fp8_kv_cache_is_its_own_series_under_the_same_fingerprint() -> None:
    base = _start()
    assert base.kv_cache is not None and base.config.kv_cache_dtype is None
    fp8 = base.kv_cache.model_copy(update={"dtype": "uint8", "dtype_bytes": 1})
    runs = [_copy(base, 1), _copy(base, 2, kv_cache=fp8), _copy(base, 3)]
    hist = history("llama8b", runs)
    assert len({p.config_fingerprint for p in hist.points}) == 1
    assert [p.series for p in hist.points] == [0, 1, 0]
    # The FP8 start is never the baseline of a BF16 one, nor compared with it.
    assert hist.points[1].compared_with is None and hist.points[2].compared_with == "run-1"
    assert [c.field for c in hist.points[1].config_changes] == ["KV cache element"]
    _, own = config_legends(hist)
    assert len(set(own)) == len(own) == 2 and "1 byte (FP8)" in own[1]


def test_look_alike_configurations_get_the_field_that_tells_them_apart() -> None:
    base = _start()
    other = base.config.model_copy(update={"max_cudagraph_capture_size": 64})
    hist = history(
        "llama8b",
        [
            _copy(base, 1, config_fingerprint=None),
            _copy(base, 2, config=other, config_fingerprint=None),
        ],
    )
    _, own = config_legends(hist)
    assert len(set(own)) == 2
    assert "max_cudagraph_capture_size 64" in own[1]


def test_every_series_of_a_page_has_its_own_look_and_none_is_red() -> None:
    looks = {(series_color(i), series_marker(i)) for i in range(DISTINCT_SERIES)}
    assert len(looks) == DISTINCT_SERIES
    assert BAD_COLOR not in {color for color, _ in looks}


def test_a_history_is_paged_newest_first_with_global_baselines() -> None:
    base = _start()
    hist = history("llama8b", [_copy(base, i) for i in range(250)])
    assert history_pages(hist) == 3
    newest, oldest = history_window(hist, 1), history_window(hist, 3)
    assert [p.run_id for p in newest.points] == [f"run-{i}" for i in range(150, 250)]
    assert [p.run_id for p in oldest.points] == [f"run-{i}" for i in range(50)]
    # The first run of page 1 is compared with the last run of page 2.
    assert newest.points[0].compared_with == "run-149"
    assert {p.series for p in newest.points} == {0} and len(newest.configs) == 1
