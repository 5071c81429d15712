"""Bad capture-plan input raises ConfigError naming the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from memest.errors import ConfigError
from memest.plan import PlanInput, plan_input_from_compilation_config, resolve

BASE: dict[str, Any] = {"sm100": True, "max_num_seqs": 1024, "max_num_batched_tokens": 16384}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_prefill_cudagraph_capture_tokens": 0}, "max_prefill_cudagraph_capture_tokens=0"),
        ({"max_decode_cudagraph_capture_requests": -4}, "max_decode_cudagraph_capture_requests=-4"),
        ({"max_decode_cudagraph_capture_tokens": 0}, "max_decode_cudagraph_capture_tokens=0"),
        ({"max_num_seqs": 0}, "max_num_seqs=0"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens=-1"),
        (
            {"prefill_cudagraph_capture_token_sizes": (1, 2.5)},
            "prefill_cudagraph_capture_token_sizes",
        ),
        (
            {"decode_cudagraph_capture_request_sizes": (4, 2, 8)},
            "decode_cudagraph_capture_request_sizes",
        ),
        (
            {
                "prefill_cudagraph_capture_token_sizes": (8, 8192),
                "max_prefill_cudagraph_capture_tokens": 4096,
            },
            "above max_prefill_cudagraph_capture_tokens=4096",
        ),
        (
            {"spec_method": "medusa", "num_speculative_tokens": 3},
            "speculative_config.method='medusa'",
        ),
        (
            {
                "cudagraph_capture_sizes": (1, 2, 4),
                "decode_cudagraph_capture_request_sizes": (1, 2),
            },
            "cudagraph_capture_sizes",
        ),
        (
            {"max_cudagraph_capture_size": 512, "max_prefill_cudagraph_capture_tokens": 8192},
            "max_cudagraph_capture_size=512",
        ),
        ({"num_speculative_tokens": 3}, "num_speculative_tokens=3"),
        ({"cudagraph_mode": "SOMETIMES"}, "cudagraph_mode='SOMETIMES'"),
        (
            {"spec_method": "eagle3", "num_speculative_tokens": 7, "dynamic_sd": ((2, 16, 7),)},
            "num_speculative_tokens_per_batch_size",
        ),
    ],
)
def test_bad_input_names_field_and_value(fields: dict[str, Any], named: str) -> None:
    # GIVEN a bad field WHEN the input is built THEN ConfigError names it
    with pytest.raises(ConfigError) as info:
        PlanInput(**{**BASE, **fields})
    assert named in str(info.value)


def test_mixing_check_names_the_new_field() -> None:
    with pytest.raises(
        ConfigError, match="must not be mixed with max_prefill_cudagraph_capture_tokens"
    ):
        PlanInput(**BASE, max_cudagraph_capture_size=512, max_prefill_cudagraph_capture_tokens=8192)


def test_budget_may_be_combined_with_legacy_fields() -> None:
    inp = PlanInput(
        **BASE, max_cudagraph_capture_size=512, max_decode_cudagraph_capture_tokens=2048
    )
    assert inp.uses_legacy_fields


def test_compilation_config_json_is_parsed_like_vllms_flag() -> None:
    inp = plan_input_from_compilation_config(
        '{"max_prefill_cudagraph_capture_tokens": 8192, "max_decode_cudagraph_capture_requests": 512,'
        ' "cudagraph_mode": "full_and_piecewise", "compile_sizes": []}',
        sm100=True,
        max_num_seqs=1024,
        max_num_batched_tokens=16384,
        spec_method="dspark",
        num_speculative_tokens=7,
    )
    assert inp.max_decode_cudagraph_capture_requests == 512
    assert inp.cudagraph_mode == "FULL_AND_PIECEWISE"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "compilation_config"),
        ("[1, 2]", "compilation_config"),
        ('{"cudagraph_capture_sizes": "1,2"}', "cudagraph_capture_sizes"),
        ('{"max_cudagraph_capture_size": true}', "max_cudagraph_capture_size=True"),
        ('{"cudagraph_mode": "WARP"}', "cudagraph_mode='WARP'"),
    ],
)
def test_bad_compilation_config(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_input_from_compilation_config(
            text, sm100=False, max_num_seqs=8, max_num_batched_tokens=2048
        )
    assert named in str(info.value)


def test_unknown_sizing_is_named() -> None:
    with pytest.raises(ConfigError, match="sizing='v2'"):
        resolve(PlanInput(**BASE), "v2")  # type: ignore[arg-type]


def test_oversized_entries_are_dropped_with_a_warning_naming_them() -> None:
    # GIVEN list entries above max_num_batched_tokens / max_num_seqs
    inp = PlanInput(
        sm100=True,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        prefill_cudagraph_capture_token_sizes=(512, 2048, 4096, 8192),
        decode_cudagraph_capture_request_sizes=(1, 32, 64, 128),
    )
    plan = resolve(inp, "seed")
    rows = {r.runner: r for r in plan.runners}
    # THEN they are gone and the warning names field and entries
    assert rows["target.piecewise"].sizes == [512, 2048]
    assert rows["target.full"].sizes == [1, 32, 64]
    assert any(
        "prefill_cudagraph_capture_token_sizes" in w and "[4096, 8192]" in w for w in plan.warnings
    )
    assert any(
        "decode_cudagraph_capture_request_sizes" in w and "[128]" in w for w in plan.warnings
    )


def test_empty_lists_disable_their_kind() -> None:
    inp = PlanInput(
        **BASE,
        spec_method="eagle3",
        num_speculative_tokens=3,
        decode_cudagraph_capture_request_sizes=(),
    )
    rows = {r.runner: r.graph_count for r in resolve(inp, "seed").runners}
    assert rows["target.full"] == 0
    assert rows["draft.steps.full"] == 0
    assert rows["target.piecewise"] == 39
    both = PlanInput(
        **BASE, decode_cudagraph_capture_request_sizes=(), prefill_cudagraph_capture_token_sizes=()
    )
    assert resolve(both, "seed").total_graphs == 0
