"""torch.compile's generated code: the FX nodes and modules behind each Inductor allocation.

Under VLLM_COMPILE the allocating frame is Inductor's generated wrapper (``<2>/c<hash>.py``).
Two things name what each allocation is for:

- the generated module's own text (allocation lines, the kernel that first writes each buffer and
  its "Source Nodes" comment), parsed at the end of init from every module Inductor loaded
  (``PyCodeCache``), compiled or loaded from a cache alike (memest.analysis.inductor);
- the FX graph handed to the compiler: each node's module path (``nn_module_stack``), stack
  frame, op and inputs. ``record_graph`` reads it before vLLM's compiler-adaptor ``compile`` /
  ``load`` (which may rewrite a donated graph) and links it to the generated modules that call
  loaded; the node map is also written to ``MEMEST_CODE_MAP_DIR/<2>/c<hash>.json``, keyed by the
  module's content hash, so a start that loads that code from vLLM's compile cache (where vLLM
  strips ``nn_module_stack`` or skips the graph) gets the same map as the start that compiled it.
  Code compiled by a start without memest has no kept map: its map is rebuilt from the split
  graph vLLM keeps in its compile cache (``compile_cache.CacheGraphs``; module paths from the
  parameters each node reads), and a note says so.

Everything here runs in ``guarded`` blocks: a missing, unreadable or unparsable file is a note.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from memest.analysis.inductor import (
    attach_nodes,
    generated_key,
    innermost_frame,
    module_path,
    parse_generated,
)
from memest.schema import CompiledCode, CompiledFile, CompiledNode
from memest.snapshot import scrub_path, scrub_roots_default
from memest_instrumentation.vllm.compile_cache import CacheGraphs
from memest_instrumentation.vllm.state import guarded, state

_MAX_SOURCE_BYTES = 16 << 20  # a generated module larger than this is skipped (named in notes)
_NODE_OPS = ("call_function", "call_method", "call_module")


def _code_cache() -> Any:
    codecache = sys.modules.get("torch._inductor.codecache")
    return None if codecache is None else codecache.PyCodeCache


def _keyed(mods: Iterable[Any], found: dict[str, str]) -> dict[str, str]:
    for mod in mods:
        path = str(getattr(mod, "__file__", "") or "")
        key = generated_key(path)
        if key is not None:
            found.setdefault(key, path)
    return found


def loaded_modules() -> dict[str, str]:
    """``<2>/c<hash>.py`` -> path of every module Inductor's PyCodeCache has loaded.

    PyCodeCache keeps ``modules`` (a list) and ``modules_no_attr`` (path -> module), both
    appended to by ``load_by_key_path`` in the top-level process, in torch 2.11 and 2.14 alike.
    """
    cache = _code_cache()
    if cache is None:  # Inductor never ran in this process: nothing to import or read
        return {}
    mods = list(getattr(cache, "modules", []) or [])
    return _keyed([*mods, *(getattr(cache, "modules_no_attr", {}) or {}).values()], {})


def _mark() -> tuple[int, int]:
    """How many modules PyCodeCache holds now (both lists only grow, until a cache clear)."""
    cache = _code_cache()
    if cache is None:
        return 0, 0
    return len(getattr(cache, "modules", []) or []), len(
        getattr(cache, "modules_no_attr", {}) or {}
    )


def _loaded_since(mark: tuple[int, int]) -> dict[str, str]:
    """The generated modules PyCodeCache loaded after ``mark`` (all of them after a clear)."""
    cache = _code_cache()
    if cache is None:
        return {}
    mods = list(getattr(cache, "modules", []) or [])
    no_attr = list((getattr(cache, "modules_no_attr", {}) or {}).values())
    if len(mods) < mark[0] or len(no_attr) < mark[1]:
        return _keyed([*mods, *no_attr], {})
    return _keyed([*mods[mark[0] :], *no_attr[mark[1] :]], {})


def _target(node: Any) -> str | None:
    """The op a node calls: ``torch.ops.<ns>.<op>.<overload>``, a qualified function name, or
    the method / submodule name."""
    target = node.target
    if isinstance(target, str):
        return target
    if type(target).__name__ in ("OpOverload", "OpOverloadPacket"):
        return f"torch.ops.{target}"
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not name:
        return None
    return f"{module}.{name}" if module else str(name)


def _inputs(node: Any) -> list[str]:
    """Computing nodes a node reads, looking through ``getitem`` of a multi-output node."""
    out: list[str] = []
    for arg in node.all_input_nodes:
        while arg.op == "call_function" and getattr(arg.target, "__name__", "") == "getitem":
            if not arg.all_input_nodes:
                break
            arg = arg.all_input_nodes[0]
        if arg.op in _NODE_OPS:
            out.append(arg.name)
    return list(dict.fromkeys(out))


_Row = tuple[str, Any, Any, list[str], str | None]


def graph_rows(graph_module: Any) -> list[_Row]:
    """What the map needs from each computing node, read before the compiler sees the graph
    (vLLM on torch >= 2.13 donates the graph to standalone_compile, which may rewrite it)."""
    rows: list[_Row] = []
    for node in graph_module.graph.nodes:
        if node.op not in _NODE_OPS:
            continue
        meta = node.meta
        rows.append(
            (
                node.name,
                meta.get("nn_module_stack"),
                meta.get("stack_trace"),
                _inputs(node),
                _target(node),
            )
        )
    return rows


def rows_nodes(rows: list[_Row], roots: Iterable[str] = ()) -> dict[str, CompiledNode]:
    """Module path, innermost stack frame, op and inputs of each row with a module or frame."""
    roots = list(roots)
    out: dict[str, CompiledNode] = {}
    for name, stack, trace, inputs, target in rows:
        module = None
        if stack:
            last = list(stack.values())[-1]
            module = module_path(str(last[0] if isinstance(last, tuple) else last))
        frame = innermost_frame(str(trace or ""))
        if not module and frame is None and not inputs:
            continue
        out[name] = CompiledNode(
            module=module or None,
            file=scrub_path(frame[0], roots) if frame else None,
            line=frame[1] if frame else None,
            function=frame[2] if frame else None,
            code=frame[3][:200] if frame else None,
            target=target[:200] if target else None,
            inputs=inputs,
        )
    return out


def map_path(key: str) -> Path:
    """Where the node map of generated module ``key`` is kept across starts."""
    base = Path(os.path.expanduser(state().settings.code_map_dir))
    return base / (key[: -len(".py")] + ".json")


def _write_map(key: str, nodes: dict[str, CompiledNode]) -> None:
    path = map_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {name: n.model_dump(exclude_none=True) for name, n in sorted(nodes.items())}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "nodes": data}, sort_keys=True))
    tmp.replace(path)


def _read_map(key: str) -> dict[str, CompiledNode]:
    path = map_path(key)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("key") != key:
        return {}
    return {name: CompiledNode.model_validate(n) for name, n in data["nodes"].items()}


def _remember(rows: list[_Row], keys: list[str]) -> None:
    """Link the graph's nodes to the generated modules its compile/load brought in."""
    nodes = rows_nodes(rows, scrub_roots_default())
    if not any(n.module for n in nodes.values()):
        return  # a graph without module paths (vLLM's cached graphs): keep what is known
    st = state()
    for key in keys:
        if key in st.code_nodes:
            continue
        st.code_nodes[key] = nodes
        guarded("compiled_code", _write_map, key, nodes)


def record_graph(graph_module: Any, call: Callable[[], Any]) -> Any:
    """Run ``call`` (a compile or a load of ``graph_module``); map the modules it loaded."""
    mark = guarded("compiled_code", _mark)
    rows = guarded("compiled_code", graph_rows, graph_module) if graph_module is not None else None
    result = call()
    if mark is not None and rows:
        new = guarded("compiled_code", _loaded_since, mark) or {}
        if new:
            guarded("compiled_code", _remember, rows, sorted(new))
    return result


def wrap_adaptor(orig: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's compiler adaptors' ``compile(self, graph, ...)`` and ``load(self, handle, graph,
    ...)``: the graph behind the generated modules the call loads."""

    @functools.wraps(orig)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        st = state()
        if not st.settings.enabled or st.shedding:
            return orig(self, *args, **kwargs)
        graph = kwargs.get("graph")
        if graph is None:
            pos = 1 if orig.__name__ == "load" else 0
            graph = args[pos] if len(args) > pos else None
        return record_graph(graph, lambda: orig(self, *args, **kwargs))

    return wrapper


def _file(
    key: str, path: str, notes: list[str], cache: CacheGraphs | None = None
) -> CompiledFile | None:
    p = Path(path)
    if not p.is_file():
        notes.append(f"{key}: generated module not found at the end of init")
        return None
    if p.stat().st_size > _MAX_SOURCE_BYTES:
        notes.append(f"{key}: generated module over {_MAX_SOURCE_BYTES >> 20} MiB, not read")
        return None
    text = p.read_text(encoding="utf-8", errors="replace")
    if "empty_strided" not in text and "= torch.ops." not in text:
        return None  # a kernel's module (Triton, C++ binding): it allocates nothing
    try:
        parsed = parse_generated(text, key)
    except (SyntaxError, ValueError) as exc:
        notes.append(f"{key}: generated module not parsed ({type(exc).__name__})")
        return None
    if not parsed.sites:
        return None
    st = state()
    nodes = st.code_nodes.get(key)
    if nodes is None:
        nodes = guarded("compiled_code", _read_map, key) or {}
        if not nodes and cache is not None:
            nodes = guarded("compiled_code", cache.rebuild, key, text, notes) or {}
        if not nodes:
            notes.append(
                f"{key}: no module map (compiled in a start without memest; start once with "
                "memest on and a cold compile cache, or keep maps in MEMEST_CODE_MAP_DIR)"
            )
    attach_nodes(parsed, nodes)
    return parsed


def collect(vllm_config: Any = None) -> CompiledCode | None:
    """The map of every generated module loaded in this process (None: torch.compile unused).

    A module without a recorded or kept map gets one rebuilt from ``vllm_config``'s compile
    cache (:class:`CacheGraphs`)."""
    modules = loaded_modules()
    if not modules:
        return None
    notes: list[str] = []
    cache = CacheGraphs(vllm_config) if vllm_config is not None else None
    files = [
        f for key in sorted(modules) if (f := _file(key, modules[key], notes, cache)) is not None
    ]
    return CompiledCode(files=files, notes=notes)
