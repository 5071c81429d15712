from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate import (
    startup_plan_dir,
    startup_plan_document,
    startup_plan_filename,
    write_startup_plan,
)
from memest.units import GiB

FP = "0123456789abcdef"


def test_document_has_vllm_keys() -> None:
    assert startup_plan_document(FP, 60 * GiB, 130 * GiB, vllm_version="0.33.0") == {
        "schema": 1,
        "fingerprint": FP,
        "kv_cache_memory_bytes": 60 * GiB,
        "free_memory_baseline": 130 * GiB,
    }


@pytest.mark.parametrize(
    ("fingerprint", "kv", "baseline", "field"),
    [
        ("XYZ", GiB, GiB, "fingerprint"),
        (FP, 0, GiB, "kv_cache_memory_bytes"),
        (FP, -5, GiB, "kv_cache_memory_bytes"),
        (FP, 1.5, GiB, "kv_cache_memory_bytes"),
        (FP, GiB, -1, "free_memory_baseline"),
    ],
)
def test_bad_values_are_named(fingerprint: str, kv: int, baseline: int, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        startup_plan_document(fingerprint, kv, baseline)


def test_write_is_atomic_and_named_as_vllm_expects(tmp_path: Path) -> None:
    directory = startup_plan_dir(tmp_path)
    path = write_startup_plan(directory, startup_plan_document(FP, GiB, 2 * GiB))
    assert path == tmp_path / "startup_plan" / f"startup_plan_{FP}.json"
    assert startup_plan_filename(FP) == path.name
    assert json.loads(path.read_text())["kv_cache_memory_bytes"] == GiB
    assert [p.name for p in directory.iterdir()] == [path.name]  # no temp file left


def test_each_release_gets_its_own_schema(tmp_path: Path) -> None:
    # vLLM 0.34.0 raised PLAN_SCHEMA_VERSION to 2 (its fingerprint hashes the config anew)
    doc = startup_plan_document(FP, GiB, 2 * GiB, vllm_version="0.34.0")
    assert doc["schema"] == 2
    assert json.loads(write_startup_plan(tmp_path, doc).read_text())["schema"] == 2
    with pytest.raises(ConfigError, match="vllm_version='0.35.0'"):
        startup_plan_document(FP, GiB, 2 * GiB, vllm_version="0.35.0")


def test_write_refuses_a_tampered_document(tmp_path: Path) -> None:
    doc = startup_plan_document(FP, GiB, 2 * GiB)
    doc["schema"] = 3
    with pytest.raises(ConfigError, match=r"schema=3: expected one of 1 \(vLLM 0\.33\.0\)"):
        write_startup_plan(tmp_path, doc)


@pytest.mark.vllm
def test_vllm_loads_and_applies_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        from vllm.v1.worker import startup_plan as vllm_plan
    except ImportError:
        from tests.conftest import require_or_skip

        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM is not installed")
        return
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("VLLM_ENABLE_STARTUP_PLAN", "1")
    kv, baseline = 61 * GiB, 130 * GiB
    write_startup_plan(startup_plan_dir(tmp_path), startup_plan_document(FP, kv, baseline))

    assert vllm_plan._plan_path(FP) == str(tmp_path / "startup_plan" / f"startup_plan_{FP}.json")
    plan = vllm_plan._load_plan(FP)
    assert plan is not None
    assert vllm_plan._applicable_kv_cache_memory_bytes(plan, baseline) == kv
    assert vllm_plan._applicable_kv_cache_memory_bytes(plan, baseline - 1) is None

    # The whole apply path, with the fingerprint a running worker would compute.
    monkeypatch.setattr(vllm_plan, "compute_plan_fingerprint", lambda cfg, rank, world: FP)
    worker = types.SimpleNamespace(
        vllm_config=None,
        rank=0,
        parallel_config=types.SimpleNamespace(world_size=1),
        cache_config=types.SimpleNamespace(kv_cache_memory_bytes=None),
        init_snapshot=types.SimpleNamespace(free_memory=baseline + GiB),
    )
    vllm_plan.maybe_apply_startup_plan(worker)
    assert worker.cache_config.kv_cache_memory_bytes == kv
