"""Shared test setup.

Optional-dependency tests (vLLM, PostgreSQL, browser) skip when the dependency is missing, unless
the matching MEMEST_REQUIRE_* variable is set: CI sets them, so a skip there is a failure.
GPU tests run only with --run-gpu (on the lent H200).
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", help="run tests marked gpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_other_vllm_releases(items)
    if config.getoption("--run-gpu"):
        return
    skip = pytest.mark.skip(reason="GPU test: run with --run-gpu on a CUDA machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _skip_other_vllm_releases(items: list[pytest.Item]) -> None:
    """``@pytest.mark.vllm_release("0.33.0")``: a check of that release's own code, skipped
    (never failed, MEMEST_REQUIRE_VLLM or not) where another release is installed: CI runs it
    in the venv of that release (scripts/test.sh, scripts/test-vllm034.sh)."""
    from memest.vllm_versions import installed_vllm_version

    installed = installed_vllm_version()
    for item in items:
        marker = item.get_closest_marker("vllm_release")
        if marker is None or installed is None or installed in marker.args:
            continue
        wanted = ", ".join(marker.args)
        item.add_marker(
            pytest.mark.skip(reason=f"checks vLLM {wanted}'s code; {installed} is installed")
        )


def require_or_skip(env_var: str, reason: str) -> None:
    """Skip with ``reason``, or fail when ``env_var`` is set (CI must not skip these)."""
    if os.environ.get(env_var) == "1":
        pytest.fail(f"{reason} (and {env_var}=1 forbids skipping)")
    pytest.skip(reason)


def require_tool(module_or_command: str, *, command: bool = False) -> None:
    """Skip (or fail under MEMEST_REQUIRE_DEPLOY=1) when a deploy-check tool is missing: a Python
    module of the dev extra (build, kubernetes_validate) or a command (prometheus, kubectl)."""
    import importlib.util
    import shutil

    found = (
        shutil.which(module_or_command) is not None
        if command
        else importlib.util.find_spec(module_or_command) is not None
    )
    if not found:
        kind = "command" if command else "module"
        require_or_skip("MEMEST_REQUIRE_DEPLOY", f"{kind} {module_or_command} is not installed")
