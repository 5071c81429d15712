"""The compiled-code map never raises inside vLLM: broken, missing or odd inputs become notes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from memest_instrumentation.vllm import inductor
from memest_instrumentation.vllm.state import state

from memest.analysis.inductor import listed_inputs

KEY = "ab/c" + "a" * 52 + ".py"


@pytest.fixture
def fake_codecache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    pytest.importorskip("torch")
    from torch._inductor.codecache import PyCodeCache

    modules: list[Any] = []
    monkeypatch.setattr(PyCodeCache, "modules", modules, raising=False)
    monkeypatch.setattr(PyCodeCache, "modules_no_attr", {}, raising=False)
    monkeypatch.setenv("MEMEST_CODE_MAP_DIR", str(tmp_path / "maps"))
    from memest_instrumentation.vllm.state import reset_state

    reset_state()
    return modules


def test_missing_and_broken_generated_files_are_notes(
    fake_codecache: list[Any], tmp_path: Path
) -> None:
    broken = tmp_path / "cd" / ("c" + "d" * 52 + ".py")
    broken.parent.mkdir()
    broken.write_text("def call(args):\n    buf0 = empty_strided_cuda((\n")
    fake_codecache.append(SimpleNamespace(__file__=str(tmp_path / KEY)))
    fake_codecache.append(SimpleNamespace(__file__=str(broken)))
    code = inductor.collect()
    assert code is not None and code.files == []
    assert any("not found" in n for n in code.notes)
    assert any("not parsed (SyntaxError)" in n for n in code.notes)
    assert state().hook_errors == []


def test_an_unreadable_kept_map_is_a_hook_error_not_a_raise(
    fake_codecache: list[Any], tmp_path: Path
) -> None:
    gen = tmp_path / KEY
    gen.parent.mkdir(parents=True)
    gen.write_text(
        "def call(args):\n"
        "    buf0 = empty_strided_cuda((4, ), (1, ), torch.float32)\n"
        "    # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.mm]\n"
        "    extern_kernels.mm(args[0], args[1], out=buf0)\n"
    )
    kept = inductor.map_path(KEY)
    kept.parent.mkdir(parents=True)
    kept.write_text("{not json")
    fake_codecache.append(SimpleNamespace(__file__=str(gen)))
    code = inductor.collect()
    assert code is not None and [s.line for s in code.files[0].sites] == [2]
    assert code.files[0].nodes == {}
    assert any(e.startswith("compiled_code: JSONDecodeError") for e in state().hook_errors)


def test_record_graph_returns_the_result_whatever_the_graph() -> None:
    assert inductor.record_graph(None, lambda: 7) == 7
    assert inductor.record_graph(object(), lambda: "compiled") == "compiled"


def test_the_adaptor_wrapper_passes_through_when_memest_is_off() -> None:
    calls: list[tuple[Any, ...]] = []

    def compile(self: Any, graph: Any, example_inputs: Any) -> str:  # noqa: A001
        calls.append((graph, example_inputs))
        return "artifact"

    wrapped = inductor.wrap_adaptor(compile)
    assert wrapped(object(), "g", [1]) == "artifact"
    assert calls == [("g", [1])]


def test_a_failing_compile_propagates_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    from memest_instrumentation.vllm.state import reset_state

    reset_state()

    class Boom(RuntimeError):
        pass

    def compile(self: Any, graph: Any, example_inputs: Any) -> str:  # noqa: A001
        raise Boom("vLLM's own error")

    with pytest.raises(Boom):
        inductor.wrap_adaptor(compile)(object(), "g", [])


def test_the_graph_is_read_before_the_compiler_may_rewrite_it(
    fake_codecache: list[Any], tmp_path: Path
) -> None:
    # GIVEN a real FX graph with module paths, and a "compile" that loads a generated module and
    # then strips the graph's metadata (vLLM donates the graph to standalone_compile on torch
    # >= 2.13, which may rewrite it)
    import torch

    class Proj(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv_proj = torch.nn.Linear(4, 12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.qkv_proj(x).float().relu()

    captured: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append(gm)
        return gm.forward

    torch.compile(Proj(), backend=backend, fullgraph=True)(torch.ones(2, 4))
    (gm,) = captured
    gen = tmp_path / KEY
    gen.parent.mkdir(parents=True, exist_ok=True)
    gen.write_text("def call(args):\n    pass\n")

    def compile_and_donate() -> str:
        fake_codecache.append(SimpleNamespace(__file__=str(gen)))
        for node in gm.graph.nodes:
            node.meta.clear()
        return "compiled"

    # WHEN it runs under record_graph THEN the map names the nodes as they were before
    assert inductor.record_graph(gm, compile_and_donate) == "compiled"
    nodes = state().code_nodes[KEY]
    linear = [n for n in nodes.values() if n.module == "qkv_proj"]
    assert len(linear) == 1 and linear[0].target == "torch._C._nn.linear"
    relu = [name for name, n in nodes.items() if n.target and n.target.endswith("relu")]
    assert len(relu) == 1
    # the relu reads the linear through the float() cast; listed_inputs looks through it
    (lin_name,) = [name for name, n in nodes.items() if n.module == "qkv_proj"]
    assert nodes[relu[0]].inputs != [lin_name]
    assert listed_inputs(relu[0], nodes, {relu[0], lin_name}) == [lin_name]
    assert state().hook_errors == []


def test_only_modules_loaded_during_the_call_are_linked(
    fake_codecache: list[Any], tmp_path: Path
) -> None:
    # GIVEN one generated module loaded before the call and one during it
    before = SimpleNamespace(__file__=str(tmp_path / ("ee/c" + "e" * 52 + ".py")))
    during = SimpleNamespace(__file__=str(tmp_path / KEY))
    fake_codecache.append(before)
    mark = inductor._mark()
    fake_codecache.append(during)
    assert list(inductor._loaded_since(mark)) == [KEY]
    # a cache clear in between (the lists shrank): every module loaded now counts
    fake_codecache.clear()
    fake_codecache.append(during)
    assert list(inductor._loaded_since((5, 0))) == [KEY]
