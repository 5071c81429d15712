"""The plan pipeline: flags -> PlanInput -> vLLM's sizes -> the seed's tiers -> rows, each stage
once, and a pre-flight or a what-if entering each file of the plan a few times only."""

from __future__ import annotations

import importlib
from collections import Counter
from typing import Any

import pytest

from lab.walk import run
from memest.plan import PlanInput, resolve, resolve_both

pipeline = importlib.import_module("memest.plan.resolve")  # the package re-exports resolve()

GB200: dict[str, Any] = {"sm100": True, "max_num_seqs": 1024, "max_num_batched_tokens": 16384}


@pytest.fixture
def stages(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of each sizing stage through memest.plan.resolve."""
    calls: Counter[str] = Counter()
    for name in ("vllm_sizes", "resolve_seed"):
        stage = getattr(pipeline, name)

        def counted(*args: Any, _stage: Any = stage, _name: str = name) -> Any:
            calls[_name] += 1
            return _stage(*args)

        monkeypatch.setattr(pipeline, name, counted)
    return calls


def test_resolve_both_sizes_with_vllm_once_and_the_seed_once(stages: Counter[str]) -> None:
    seed, main = resolve_both(PlanInput(**GB200, spec_method="dspark", num_speculative_tokens=7))
    assert stages == {"vllm_sizes": 1, "resolve_seed": 1}
    assert (main.total_graphs, seed.total_graphs) == (243, 138)  # the seed's published totals


def test_vllms_plan_never_enters_the_seed(stages: Counter[str]) -> None:
    resolve(PlanInput(**GB200), "vllm-0.33.0")
    assert stages == {"vllm_sizes": 1}


@pytest.mark.parametrize(
    ("method", "k", "q", "block_q", "drafter"),
    [
        (None, 0, 1, 1, "none"),
        ("eagle3", 3, 4, 4, "target_dependent_ar"),
        ("dspark", 7, 8, 7, "block"),  # DSpark samples from the anchor: K query slots
        ("dflash", 7, 8, 8, "block"),  # the DFlash family adds the bonus slot
    ],
)
def test_plan_input_derives_what_later_stages_read(
    method: str | None, k: int, q: int, block_q: int, drafter: str
) -> None:
    inp = PlanInput(**GB200, spec_method=method, num_speculative_tokens=k)
    assert (inp.q, inp.block_q, inp.drafter, inp.uses_legacy_fields) == (q, block_q, drafter, False)
    assert PlanInput(**GB200, max_cudagraph_capture_size=512).uses_legacy_fields


@pytest.mark.parametrize("name", ["preflight", "what-if"])
def test_a_request_walks_the_plan_and_the_preflight_a_few_times(name: str) -> None:
    walk = run(name)
    assert walk.climb_count <= 2, walk.climbs
    # the plan resolved once: its stages entered once each, inputs.py at most thrice
    walked = ("memest/plan/", "memest/preflight/")
    over = {f: n for f, n in walk.entries.items() if f.startswith(walked) and n > 3}
    assert over == {}
    assert walk.entries["memest/plan/resolve.py"] == 1
    assert "memest/plan/seed.py" not in walk.entries  # vLLM's sizing alone


def test_the_what_if_enters_each_of_its_files_at_most_three_times() -> None:
    walk = run("what-if")
    whatif = "memest/estimate/whatif/"
    over = {f: n for f, n in walk.entries.items() if f.startswith(whatif) and n > 3}
    assert over == {}
