"""Fixtures for the vLLM plugin tests: a fresh plugin state per test, env cleared of MEMEST_*."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def fresh_plugin_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("MEMEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MEMEST_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    from memest_instrumentation.vllm.state import reset_state

    reset_state()
    yield
    reset_state()


def vllm_or_skip() -> None:
    try:
        import vllm  # noqa: F401
        import vllm.v1.worker.gpu_worker  # noqa: F401
    except Exception as exc:
        from tests.conftest import require_or_skip

        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")


@pytest.fixture
def needs_vllm() -> None:
    """For fake starts: their hooks import torch and vLLM's own modules."""
    vllm_or_skip()
