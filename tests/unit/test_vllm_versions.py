"""memest.vllm_versions: the table's figures against the installed vLLM's own code, and the lookup.

The oracle tests read the installed release's source (its constants by AST, so without importing
torch) or call its functions; each runs on the release installed (0.33.0 in .venv, 0.34.0 in
.venv-vllm034, scripts/test-vllm034.sh) and skips elsewhere.
"""

from __future__ import annotations

import ast
import importlib.metadata
import random
from pathlib import Path
from typing import Any

import pytest

from memest.errors import ConfigError
from memest.vllm_versions import (
    NEWEST,
    SUPPORTED,
    VERSIONS,
    UnsupportedVllmVersion,
    installed_vllm_version,
    resolve_version,
)


def _source(relative: str) -> ast.Module:
    """The installed vLLM's ``relative`` file, parsed; skip when vLLM is not installed."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vLLM is not installed")
    path = Path(str(dist.locate_file(relative)))
    return ast.parse(path.read_text(), str(path))


def _constant(tree: ast.AST, name: str) -> Any:
    """The literal assigned to ``name`` (module or class level); ``(a if rocm else b) << n`` and
    similar CUDA-vs-ROCm expressions are evaluated with the CUDA branch."""
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:  # type: ignore[attr-defined]
            return _cuda_value(node.value)  # type: ignore[attr-defined]
    raise AssertionError(f"{name} not found")


def _cuda_value(node: ast.expr) -> Any:
    if isinstance(node, ast.IfExp):  # `A if current_platform.is_rocm() else B`
        return _cuda_value(node.orelse)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift):
        return _cuda_value(node.left) << _cuda_value(node.right)
    if isinstance(node, ast.Call):  # Field(default=...)
        for keyword in node.keywords:
            if keyword.arg == "default":
                return ast.literal_eval(keyword.value)
    return ast.literal_eval(node)


def _installed_row() -> Any:
    version = installed_vllm_version()
    if version is None:
        pytest.skip("vLLM is not installed")
    return resolve_version(version)


def test_the_cache_defaults_are_the_installed_releases() -> None:
    row = _installed_row()
    cache = _source("vllm/config/cache.py")
    assert _constant(cache, "DEFAULT_BLOCK_SIZE") == row.default_block_size
    if row.extensible_kv is None:  # 0.33.0: the field's own default
        assert _constant(cache, "gpu_memory_utilization") == row.default_gpu_memory_utilization
    else:
        assert _constant(cache, "DEFAULT_GPU_MEMORY_UTILIZATION") == (
            row.default_gpu_memory_utilization
        )


def test_the_startup_plan_schema_is_the_installed_releases() -> None:
    row = _installed_row()
    plan = _source("vllm/v1/worker/startup_plan.py")
    assert _constant(plan, "PLAN_SCHEMA_VERSION") == row.startup_plan_schema


def test_the_growable_cache_constants_are_the_installed_releases() -> None:
    row = _installed_row()
    try:
        tree = _source("vllm/v1/worker/extensible_kv_cache.py")
    except FileNotFoundError:
        assert row.extensible_kv is None  # 0.33.0 has no growable cache
        return
    kv = row.extensible_kv
    assert kv is not None
    assert _constant(tree, "KV_CACHE_MARGIN_FLOOR_BYTES") == kv.margin_floor_bytes
    assert _constant(tree, "KV_CACHE_MARGIN_FRACTION") == kv.margin_fraction
    assert _constant(tree, "KV_CACHE_WARMUP_RESERVE_FRACTION") == kv.warmup_reserve_fraction
    assert _constant(tree, "KV_CACHE_NON_TORCH_RESERVE_BYTES") == kv.non_torch_reserve_bytes


@pytest.mark.vllm
def test_serve_defaults_are_what_vllm_resolves_on_an_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    row = _installed_row()
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
    except Exception as exc:
        pytest.skip(f"vLLM is not importable: {exc}")
    monkeypatch.setattr(current_platform, "get_device_total_memory", lambda *a: 150_110_011_392)
    monkeypatch.setattr(current_platform, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(current_platform, "is_device_capability", lambda *a: False)
    tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    server = UsageContext.OPENAI_API_SERVER
    assert (seqs[server], tokens[server]) == (
        row.serve_defaults.max_num_seqs,
        row.serve_defaults.max_num_batched_tokens,
    )


@pytest.mark.vllm
def test_kv_cache_bytes_is_vllms_measure_kv_cache_bytes_over_many_readings() -> None:
    row = _installed_row()
    if row.extensible_kv is None:
        pytest.skip(f"vLLM {row.version} has no growable KV cache")
    try:
        from vllm.v1.worker.extensible_kv_cache import measure_kv_cache_bytes
    except Exception as exc:
        pytest.skip(f"vLLM is not importable: {exc}")
    rng = random.Random(35)
    gib = 1 << 30
    for _ in range(500):
        reading = {
            "init_free_memory": rng.randrange(100 * gib, 140 * gib),
            "free_memory": rng.randrange(1 * gib, 100 * gib),
            "committed_bytes": rng.randrange(0, 4 * gib),
            "requested_memory": rng.randrange(60 * gib, 141 * gib),
            "transient_peak_bytes": rng.randrange(0, 12 * gib),
            "torch_reserve_growth_bytes": rng.randrange(0, 12 * gib),
        }
        floor = rng.choice([None, 0, 256 << 20])
        fraction = rng.choice([None, 0.0, 0.5])
        ours = row.extensible_kv.kv_cache_bytes(
            **reading, margin_floor_bytes=floor, margin_fraction=fraction
        )
        extra = {} if floor is None else {"margin_floor_bytes": floor}
        if fraction is not None:
            extra["margin_fraction"] = fraction
        assert ours == measure_kv_cache_bytes(**reading, **extra), reading


def test_each_release_resolves_an_unset_utilization_as_its_cache_config_documents() -> None:
    old, new = resolve_version("0.33.0"), resolve_version("0.34.0")
    assert old.gpu_memory_utilization(None) == 0.92
    assert new.gpu_memory_utilization(None) == 1.0  # growable cache on by default on CUDA
    assert new.gpu_memory_utilization(None, extensible=False) == 0.92
    assert new.gpu_memory_utilization(0.85) == 0.85
    assert not new.extensible(kv_cache_memory_bytes=8 << 30)  # an explicit size turns it off


def test_a_utilization_out_of_range_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization=1.5"):
        resolve_version("0.34.0").gpu_memory_utilization(1.5)


def test_the_margin_has_a_floor_and_grows_with_the_transient_peak() -> None:
    kv = resolve_version("0.34.0").extensible_kv
    assert kv is not None
    assert kv.margin_bytes(0) == 1 << 30
    assert kv.margin_bytes(4 << 30) == 3 << 30  # 0.75 of a 4 GiB peak
    assert kv.kept_free_bytes(4 << 30) == 7 << 30
    assert kv.warmup_reserve_bytes(0, 100 << 30) == 10 << 30
    assert kv.memest_margin_bytes(1 << 28) == (1 << 29) + (
        1 << 28
    )  # the non-torch reserve + 256 MiB


def test_resolve_version_names_an_unsupported_release() -> None:
    with pytest.raises(
        UnsupportedVllmVersion, match=r"vllm_version='0\.32\.1'.*0\.33\.0, 0\.34\.0"
    ):
        resolve_version("0.32.1")


def test_a_local_build_tag_is_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_version("0.34.0+cu129").version == "0.34.0"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.33.0+cu128")
    assert installed_vllm_version() == "0.33.0"
    assert resolve_version(None).version == "0.33.0"


def test_without_vllm_the_newest_release_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    assert installed_vllm_version() is None
    assert resolve_version(None) is NEWEST
    assert NEWEST.version == SUPPORTED[-1] == VERSIONS[-1].version


def test_an_installed_unsupported_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.35.0")
    with pytest.raises(UnsupportedVllmVersion, match="0.35.0"):
        resolve_version(None)


def _kernel_blocks(registry: ast.Module, backend: str) -> tuple[int, ...]:
    """``get_supported_kernel_block_sizes``' CUDA answer for a bf16 KV cache, read from the
    installed source: the method's final ``return`` (the branches before it are XPU, FP8 and
    FA4-head-256 cases; FlashInfer's adds Blackwell's large pages, multiples of 16 as well),
    ``MultipleOf(n)`` read as n."""
    path = next(
        n.value
        for n in ast.walk(registry)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id == backend
    )
    module, cls = ast.literal_eval(path).rsplit(".", 1)
    tree = _source(module.replace(".", "/") + ".py")
    klass = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    method = next(
        n
        for n in klass.body
        if isinstance(n, ast.FunctionDef) and n.name == "get_supported_kernel_block_sizes"
    )
    final = [n for n in method.body if isinstance(n, ast.Return)][-1]
    assert isinstance(final.value, ast.List)
    return tuple(
        ast.literal_eval(e.args[0] if isinstance(e, ast.Call) else e) for e in final.value.elts
    )


@pytest.mark.vllm
def test_the_kernel_block_sizes_are_the_installed_releases() -> None:
    """Every backend the pre-flight names: its kernel block sizes as the installed release
    declares them, and the preferred size vLLM takes from the release's default."""
    row = _installed_row()
    registry = _source("vllm/v1/attention/backends/registry.py")
    for backend, sizes in row.kernel_blocks.items():
        theirs = _kernel_blocks(registry, backend)
        assert min(theirs) == min(sizes), backend  # what a default it refuses falls back to
        accepted = [n for n in range(1, 1025) if any(n % k == 0 for k in theirs)]
        assert accepted == [n for n in range(1, 1025) if row.supports_block_size(backend, n)]
    assert _constant(_source("vllm/config/cache.py"), "DEFAULT_BLOCK_SIZE") == (
        row.default_block_size
    )


def test_each_releases_preferred_block_size_by_hand() -> None:
    """0.33.0 tries 16 tokens first, 0.34.0 64: a backend whose kernels take the default keeps
    it, any other takes its smallest kernel block size."""
    old, new = resolve_version("0.33.0"), resolve_version("0.34.0")
    assert [old.preferred_block_size(b) for b in ("FLASH_ATTN", "FLASHMLA", "FLASHINFER_MLA")] == [
        16,
        64,
        32,
    ]
    assert [new.preferred_block_size(b) for b in ("FLASH_ATTN", "FLASHMLA", "FLASHINFER_MLA")] == [
        64,
        64,
        64,
    ]
    assert (old.preferred_block_size("CUTLASS_MLA"), new.preferred_block_size("CUTLASS_MLA")) == (
        128,
        128,
    )
    assert new.preferred_block_size("FLASHINFER_MLA_SPARSE") == 64  # 64 is a multiple of 32
    assert not new.supports_block_size("FLASHMLA", 32)
