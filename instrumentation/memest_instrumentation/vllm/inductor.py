"""torch.compile's generated code: the FX nodes and modules behind each Inductor allocation.

Under VLLM_COMPILE the allocating frame is Inductor's generated wrapper (``<2>/c<hash>.py``).
Two things name what each allocation is for:

- the generated module's own text (allocation lines, the kernel that first writes each buffer and
  its "Source Nodes" comment), parsed at the end of init from every module Inductor loaded
  (``PyCodeCache``), compiled or loaded from a cache alike (memest.analysis.inductor);
- the FX graph handed to the compiler: each node's module path (``nn_module_stack``) and stack
  frame. ``record_graph`` reads it around vLLM's compiler-adaptor ``compile`` / ``load`` and links
  it to the generated modules that call loaded; the node map is also written to
  ``MEMEST_CODE_MAP_DIR/<2>/c<hash>.json``, keyed by the module's content hash, so a start that loads that code from vLLM's compile cache (where vLLM strips
  ``nn_module_stack`` or skips the graph) gets the same map as the start that compiled it.

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

from memest.analysis.inductor import generated_key, innermost_frame, module_path, parse_generated
from memest.schema import CompiledCode, CompiledFile, CompiledNode
from memest.snapshot import scrub_path, scrub_roots_default
from memest_instrumentation.vllm.state import guarded, state

_MAX_SOURCE_BYTES = 16 << 20  # a generated module larger than this is skipped (named in notes)
_NODE_OPS = ("call_function", "call_method", "call_module")


def loaded_modules() -> dict[str, str]:
    """``<2>/c<hash>.py`` -> path of every module Inductor's PyCodeCache has loaded."""
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None:  # Inductor never ran in this process: nothing to import or read
        return {}
    PyCodeCache = codecache.PyCodeCache  # noqa: N806

    found: dict[str, str] = {}
    mods: list[Any] = list(getattr(PyCodeCache, "modules", []) or [])
    mods += list((getattr(PyCodeCache, "modules_no_attr", {}) or {}).values())
    for mod in mods:
        path = str(getattr(mod, "__file__", "") or "")
        key = generated_key(path)
        if key is not None:
            found.setdefault(key, path)
    return found


def graph_nodes(graph_module: Any, roots: Iterable[str] = ()) -> dict[str, CompiledNode]:
    """Module path and innermost stack frame of each computing node of an FX graph."""
    roots = list(roots)
    out: dict[str, CompiledNode] = {}
    for node in graph_module.graph.nodes:
        if node.op not in _NODE_OPS:
            continue
        meta = node.meta
        stack = meta.get("nn_module_stack") or {}
        module = None
        if stack:
            last = list(stack.values())[-1]
            module = module_path(str(last[0] if isinstance(last, tuple) else last))
        frame = innermost_frame(str(meta.get("stack_trace") or ""))
        if not module and frame is None:
            continue
        out[node.name] = CompiledNode(
            module=module or None,
            file=scrub_path(frame[0], roots) if frame else None,
            line=frame[1] if frame else None,
            function=frame[2] if frame else None,
            code=frame[3][:200] if frame else None,
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


def _remember(graph_module: Any, keys: list[str]) -> None:
    """Link the graph's nodes to the generated modules its compile/load brought in."""
    nodes = graph_nodes(graph_module, scrub_roots_default())
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
    before = guarded("compiled_code", loaded_modules)
    result = call()
    if before is not None and graph_module is not None:
        after = guarded("compiled_code", loaded_modules) or {}
        new = [k for k in after if k not in before]
        if new:
            guarded("compiled_code", _remember, graph_module, new)
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


def _file(key: str, path: str, notes: list[str]) -> CompiledFile | None:
    p = Path(path)
    if not p.is_file():
        notes.append(f"{key}: generated module not found at the end of init")
        return None
    if p.stat().st_size > _MAX_SOURCE_BYTES:
        notes.append(f"{key}: generated module over {_MAX_SOURCE_BYTES >> 20} MiB, not read")
        return None
    try:
        parsed = parse_generated(p.read_text(encoding="utf-8", errors="replace"), key)
    except (SyntaxError, ValueError) as exc:
        notes.append(f"{key}: generated module not parsed ({type(exc).__name__})")
        return None
    if not parsed.sites:
        return None
    st = state()
    nodes = st.code_nodes.get(key)
    if nodes is None:
        nodes = guarded("compiled_code", _read_map, key) or {}
        if not nodes:
            notes.append(f"{key}: no module map (compiled before memest recorded it)")
    parsed.nodes = {name: nodes[name] for s in parsed.sites for name in s.nodes if name in nodes}
    return parsed


def collect() -> CompiledCode | None:
    """The map of every generated module loaded in this process (None: torch.compile unused)."""
    modules = loaded_modules()
    if not modules:
        return None
    notes: list[str] = []
    files = [f for key in sorted(modules) if (f := _file(key, modules[key], notes)) is not None]
    return CompiledCode(files=files, notes=notes)
