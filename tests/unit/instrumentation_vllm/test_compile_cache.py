"""A generated module loaded from vLLM's compile cache with no kept map gets one rebuilt from the
cache's computation_graph.py at the end of init; every failure on the way is a note.

Real files: call 23's computation_graph.py and the generated module of the Llama-8B shape's last
piece (tests/data/inductor/cachehit); call 11's cold start recorded that module's map, where
layer 31's o_proj, gate_up_proj and down_proj GEMMs are ``linear``, ``linear_1``, ``linear_2``.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from memest_instrumentation.vllm import compile_cache, inductor
from memest_instrumentation.vllm.state import state

DATA = Path(__file__).resolve().parents[2] / "data" / "inductor" / "cachehit"
KEY = "4m/c4mozpcpzaepjhpkg4bjwcn3236672fyhxgvwxgbzlv3hvgrdkf7.py"


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """PyCodeCache holding the real generated module; no kept map. Returns vLLM's cache root."""
    pytest.importorskip("torch")
    from torch._inductor.codecache import PyCodeCache

    gen = tmp_path / "inductor" / KEY
    gen.parent.mkdir(parents=True)
    gen.write_bytes(gzip.decompress((DATA / f"{Path(KEY).name}.gz").read_bytes()))
    monkeypatch.setattr(PyCodeCache, "modules", [SimpleNamespace(__file__=str(gen))], raising=False)
    monkeypatch.setattr(PyCodeCache, "modules_no_attr", {}, raising=False)
    monkeypatch.setenv("MEMEST_CODE_MAP_DIR", str(tmp_path / "maps"))
    from memest_instrumentation.vllm.state import reset_state

    reset_state()
    return tmp_path / "torch_compile_cache" / "4e4bd2b2b8"


def _config(cache_dir: Path, graph: bytes | None) -> Any:
    local = cache_dir / "rank_0_0" / "backbone"
    local.mkdir(parents=True)
    if graph is not None:
        (local / "computation_graph.py").write_bytes(graph)
    return SimpleNamespace(
        compilation_config=SimpleNamespace(cache_dir=str(cache_dir), local_cache_dir=str(local)),
        parallel_config=SimpleNamespace(rank=0, data_parallel_index=0),
    )


def _graph() -> bytes:
    return gzip.decompress((DATA / "computation_graph.py.gz").read_bytes())


def test_a_missing_map_is_rebuilt_from_the_compile_cache(loaded: Path) -> None:
    code = inductor.collect(_config(loaded, _graph()))
    assert code is not None and [f.key for f in code.files] == [KEY]
    modules = {name: n.module for name, n in code.files[0].nodes.items()}
    assert modules["linear"] == "layers.31.self_attn.o_proj"
    assert modules["linear_1"] == "layers.31.mlp.gate_up_proj"
    assert modules["linear_2"] == "layers.31.mlp.down_proj"
    assert any("module map rebuilt" in n and "submod_64" in n for n in code.notes)
    assert not any("no module map" in n for n in code.notes)
    assert state().hook_errors == []


def test_without_the_config_or_the_graph_the_map_stays_missing(loaded: Path) -> None:
    for config in (None, _config(loaded, None)):
        code = inductor.collect(config)
        assert code is not None and code.files[0].nodes == {}
        assert any("no module map" in n for n in code.notes)
    assert state().hook_errors == []


def test_a_broken_graph_file_is_a_note(loaded: Path) -> None:
    code = inductor.collect(_config(loaded, b"class GraphModule(\n"))
    assert code is not None and code.files[0].nodes == {}
    assert any("computation_graph.py: not parsed (SyntaxError)" in n for n in code.notes)
    assert state().hook_errors == []


def test_a_graph_file_over_the_cap_is_not_read(
    loaded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_cache, "_MAX_GRAPH_BYTES", 1 << 10)
    code = inductor.collect(_config(loaded, _graph()))
    assert code is not None and code.files[0].nodes == {}
    assert any("computation_graph.py: over" in n and "not read" in n for n in code.notes)
