"""Stage tags: the per-event metadata string round-trips and foreign strings stay readable."""

from __future__ import annotations

from memest.snapshot.tags import StageTag, format_tag, parse_tag, pool_key


def test_round_trip_all_fields() -> None:
    tag = StageTag(phase="capture", stage="target.full", capture_size=512, pool="0,3", window=7)
    text = format_tag(tag)
    assert text == "memest/1;phase=capture;stage=target.full;size=512;pool=0,3;win=7"
    assert parse_tag(text) == tag


def test_empty_tag_is_empty_string() -> None:
    assert format_tag(StageTag()) == ""
    assert parse_tag("") == StageTag()
    assert parse_tag(None) == StageTag()


def test_separators_in_names_cannot_forge_fields() -> None:
    text = format_tag(StageTag(stage="a;pool=9,9"))
    assert parse_tag(text).pool is None
    assert parse_tag(text).stage == "a_pool_9,9"


def test_foreign_metadata_is_a_stage_name() -> None:
    assert parse_tag("my-stage") == StageTag(stage="my-stage")


def test_pool_key_forms() -> None:
    assert pool_key((0, 1)) == "0,1"
    assert pool_key([0, 12]) == "0,12"
    assert pool_key("(0, 3)") == "0,3"
    assert pool_key("0_4") == "0,4"
