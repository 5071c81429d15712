"""Inductor's generated code: which model code each of its allocations serves (pure Python).

Under torch.compile the frame that allocates is Inductor's generated wrapper (``call`` in
``<cache>/<2 chars>/c<hash>.py``). Its text says what each buffer is for::

    buf14 = empty_strided_cuda((s0, 28672), (28672, 1), torch.bfloat16)      # the allocation
    # Topologically Sorted Source Nodes: [linear_2], Original ATen: [aten.mm]
    extern_kernels.mm(buf13, reinterpret_tensor(arg10_1, ...), out=buf14)   # its first writer

``parse_generated`` reads that text into allocation sites (line, buffer, the kernel that first
writes it, the FX source nodes of that kernel). The node names are the names in the FX graph
handed to Inductor; the plugin records, per generated file, each node's module path
(``nn_module_stack``), stack frame, op and inputs, so owner rules (memest.analysis.owners) can
name the owner: the nodes are tried from the buffer's producer backwards (:func:`producer_order`),
module rules first.

The file key is the generated module's content hash, so a start that loads the same code from a
compile cache gets the same key, sites and owners as the start that compiled it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from memest.schema.report import (
    CompiledCall,
    CompiledCode,
    CompiledFile,
    CompiledNode,
    CompiledSite,
)

GENERATED_FILE = re.compile(r"(?:^|/)([a-z0-9]{2}/c[a-z0-9]{40,}\.py)$")
_SOURCE_NODES = re.compile(
    r"Source Nodes: \[(?P<nodes>[^\]]*)\](?:, Original ATen: \[(?P<aten>[^\]]*)\])?"
)
# Inductor's allocation helpers (wrapper codegen, torch 2.11 and 2.14).
_EMPTY = frozenset(
    {
        "empty_strided_cuda",
        "empty_strided_cpu",
        "empty_strided_cpu_pinned",
        "empty_strided_xpu",
        "empty_strided_mtia",
        "empty_strided_p2p",
        "empty_strided",
        "empty",
    }
)
_NOT_A_WRITER = frozenset(
    {
        "reinterpret_tensor",
        "get_raw_stream",
        "assert_size_stride",
        "assert_size_stride_grouped",
        "assert_alignment",
        "assert_tensor_metadata",
        "set_device",
        "_DeviceGuard",
    }
)
_PATH_INDEX = re.compile(r"\[(\d+)\]")
_PATH_ROOT = re.compile(r"^L\[['\"][^'\"]+['\"]\]\.?")
_TRACE_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def generated_key(filename: str) -> str | None:
    """``<2 chars>/c<hash>.py`` of a generated module's path (scrubbed or not), else None."""
    m = GENERATED_FILE.search(filename)
    return m.group(1) if m else None


def module_path(fqn: str) -> str:
    """Dynamo's ``L['self'].layers[3].self_attn.qkv_proj`` as ``layers.3.self_attn.qkv_proj``."""
    return _PATH_INDEX.sub(r".\1", _PATH_ROOT.sub("", fqn.strip())).strip(".")


def innermost_frame(stack_trace: str) -> tuple[str, int, str, str] | None:
    """(file, line, function, code) of the last frame in an FX node's ``stack_trace`` text."""
    lines = stack_trace.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _TRACE_FRAME.search(lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return m.group("file"), int(m.group("line")), m.group("func"), code
    return None


# --------------------------------------------------------------------------- parsing
@dataclass
class _Alloc:
    line: int
    buffer: str
    kernel: str | None = None
    comment: tuple[list[str], list[str]] | None = None
    written: bool = False


@dataclass
class _Walk:
    """State of one pass over a generated function's statements."""

    lines: list[str]
    kernel_comments: dict[str, tuple[list[str], list[str]]]
    allocs: list[_Alloc] = field(default_factory=list)
    calls: list[CompiledCall] = field(default_factory=list)
    root: dict[str, _Alloc] = field(default_factory=dict)
    pending: tuple[list[str], list[str]] | None = None
    last_line: int = 0


def _split(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _comment_between(lines: Sequence[str], first: int, last: int) -> tuple[list[str], list[str]]:
    """The last "Source Nodes" comment on lines first..last (1-based, inclusive), or empty."""
    for n in range(last, first - 1, -1):
        text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
        if text.startswith("#"):
            m = _SOURCE_NODES.search(text)
            if m:
                return _split(m.group("nodes")), _split(m.group("aten"))
    return [], []


def _call_name(node: ast.expr) -> str | None:
    """Dotted name of a call target: ``extern_kernels.mm``, ``triton_x.run`` -> ``triton_x``."""
    while isinstance(node, ast.Subscript):  # triton_x[grid(n)](...)
        node = node.value
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):
        return _call_name(node.func)
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    parts.reverse()
    if parts[-1] in ("run", "run_with_args") and len(parts) == 2:
        return parts[0]
    return ".".join(parts)


def _flat(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        if isinstance(stmt, (ast.With, ast.If, ast.For, ast.While, ast.Try)):
            yield from _flat(stmt.body)
            yield from _flat(getattr(stmt, "orelse", []))
        else:
            yield stmt


def _names(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id


def _kernel_comments(tree: ast.Module, lines: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Module-level ``kernel = async_compile.triton(...)`` definitions and their comment."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    prev_end = 0
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Call)
            and (_call_name(stmt.value.func) or "").startswith("async_compile.")
        ):
            nodes, aten = _comment_between(lines, prev_end + 1, stmt.lineno - 1)
            if nodes or aten:
                out[stmt.targets[0].id] = (nodes, aten)
        prev_end = stmt.end_lineno or stmt.lineno
    return out


def _statement(walk: _Walk, stmt: ast.stmt) -> None:
    comment = _comment_between(walk.lines, walk.last_line + 1, stmt.lineno - 1)
    if comment[0] or comment[1]:
        walk.pending = comment
    walk.last_line = stmt.end_lineno or stmt.lineno
    target: str | None = None
    value: ast.expr | None = None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        value = stmt.value
        if isinstance(stmt.targets[0], ast.Name):
            target = stmt.targets[0].id
    elif isinstance(stmt, ast.Expr):
        value = stmt.value
    if value is None:
        return
    if isinstance(value, ast.Name) and target:  # buf2 = buf1  # reuse
        if value.id in walk.root:
            walk.root[target] = walk.root[value.id]
        return
    if isinstance(value, ast.Subscript) and target:  # buf8 = buf7[0]
        base = value.value
        if isinstance(base, ast.Name) and base.id in walk.root:
            walk.root[target] = walk.root[base.id]
        return
    if not isinstance(value, ast.Call):
        return
    _call(walk, stmt, target, value)


def _call(walk: _Walk, stmt: ast.stmt, target: str | None, value: ast.Call) -> None:
    name = _call_name(value.func) or ""
    short = name.rsplit(".", 1)[-1]
    if target and short in _EMPTY:
        alloc = _Alloc(stmt.lineno, target)
        walk.allocs.append(alloc)
        walk.root[target] = alloc
        return
    if short == "reinterpret_tensor" and target:
        first = value.args[0] if value.args else None
        if isinstance(first, ast.Name) and first.id in walk.root:
            walk.root[target] = walk.root[first.id]
        return
    if short in _NOT_A_WRITER or not name:
        return
    comment = walk.pending or walk.kernel_comments.get(name) or ([], [])
    walk.pending = None
    if target and target.startswith("buf"):  # buf7 = torch.ops.aten.x.default(...): allocates
        alloc = _Alloc(stmt.lineno, target, name, comment, written=True)
        walk.allocs.append(alloc)
        walk.root[target] = alloc
    elif _extern(name):  # extern_kernels.mm(..., out=buf3): what it allocates is its own
        walk.calls.append(CompiledCall(line=stmt.lineno, kernel=name))
    for arg in _names(value):
        written = walk.root.get(arg)
        if written is not None and not written.written:
            written.written, written.kernel, written.comment = True, name, comment


def parse_generated(source: str, key: str) -> CompiledFile:
    """Allocation sites of one generated module (every function that allocates buffers).

    Raises:
        SyntaxError: the text is not Python.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    kernels = _kernel_comments(tree, lines)
    sites: list[CompiledSite] = []
    calls: list[CompiledCall] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        walk = _Walk(lines, kernels, last_line=fn.body[0].lineno - 1 if fn.body else fn.lineno)
        for stmt in _flat(fn.body):
            _statement(walk, stmt)
        calls.extend(walk.calls)
        for a in walk.allocs:
            nodes, aten = a.comment or ([], [])
            sites.append(
                CompiledSite(line=a.line, buffer=a.buffer, kernel=a.kernel, nodes=nodes, aten=aten)
            )
    sites.sort(key=lambda s: s.line)
    calls.sort(key=lambda c: c.line)
    return CompiledFile(key=key, sites=sites, calls=calls)


def listed_names(source: str) -> list[str]:
    """Every FX node name a generated module's "Source Nodes" comments list, first seen first."""
    names: dict[str, None] = {}
    for m in _SOURCE_NODES.finditer(source):
        names.update(dict.fromkeys(_split(m.group("nodes"))))
    return list(names)


def listed_inputs(
    name: str, nodes: dict[str, CompiledNode], listed: set[str], limit: int = 256
) -> list[str]:
    """The listed nodes ``name`` reads, directly or through nodes no comment lists (a view, a
    dtype cast), at most ``limit`` nodes walked."""
    out: list[str] = []
    stack = list(nodes[name].inputs)
    seen: set[str] = set()
    while stack and len(seen) < limit:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in listed:
            out.append(n)
        elif n in nodes:
            stack.extend(nodes[n].inputs)
    return sorted(out)


def attach_nodes(file: CompiledFile, nodes: dict[str, CompiledNode]) -> None:
    """Keep in ``file`` the nodes its sites list, each with the listed nodes it reads."""
    listed = {name for site in file.sites for name in site.nodes}
    file.nodes = {
        name: node.model_copy(update={"inputs": listed_inputs(name, nodes, listed)})
        for name, node in nodes.items()
        if name in listed
    }


# --------------------------------------------------------------------------- owners
class CompiledIndex:
    """(file key, line) -> allocation site and its file's nodes, for the owner rules."""

    def __init__(self, code: CompiledCode | None) -> None:
        self.files: dict[str, CompiledFile] = {}
        self.sites: dict[tuple[str, int], CompiledSite] = {}
        for f in code.files if code else []:
            self.files[f.key] = f
            for s in f.sites:
                self.sites[(f.key, s.line)] = s

    def __bool__(self) -> bool:
        return bool(self.files)

    def site(self, filename: str, line: int) -> tuple[CompiledFile, CompiledSite | None] | None:
        """The file and site of a frame in generated code; None when the file is not known."""
        key = generated_key(filename)
        if key is None or key not in self.files:
            return None
        return self.files[key], self.sites.get((key, line))


def op_name(name: str | None) -> str | None:
    """``namespace.op`` of a ``torch.ops`` call (``torch.ops.vllm.x.default`` -> ``vllm.x``)."""
    if not name or not name.startswith("torch.ops."):
        return None
    parts = name[len("torch.ops.") :].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def producer_order(file: CompiledFile, site: CompiledSite) -> list[str]:
    """The site's source nodes, the node that produces its buffer first.

    Inductor lists a kernel's source nodes in the order their ATen nodes were scheduled, so an
    extern op's inputs can follow it (CPU SDPA: ``o`` before the q/k-norm nodes it reads). The
    producer is the listed node whose op is the extern kernel's op; else the listed nodes no
    other listed node reads (``CompiledNode.inputs``), last first. For an extern op that is all
    (its other listed nodes are inputs computed elsewhere); a generated kernel computes every
    listed node, so the rest follow, last first. Without recorded inputs: last first.
    """
    names = list(dict.fromkeys(site.nodes))
    nodes = {n: file.nodes.get(n) for n in names}
    op = op_name(site.kernel)
    calls = [n for n in reversed(names) if op and (c := nodes[n]) and op_name(c.target) == op]
    read = {i for c in nodes.values() if c is not None for i in c.inputs}
    sinks = [n for n in reversed(names) if n not in read and n not in calls]
    if _extern(site.kernel) and (calls or read):
        return calls or sinks  # an extern op computes its producer only; the rest are inputs
    rest = [n for n in reversed(names) if n in read and n not in calls]
    return calls + sinks + rest


def _extern(kernel: str | None) -> bool:
    """An op call rather than a generated (fused) kernel: ``extern_kernels.mm``, ``torch.ops.``."""
    return bool(kernel) and str(kernel).startswith(("extern_kernels.", "torch.ops."))


def site_nodes(file: CompiledFile, site: CompiledSite) -> list[tuple[str, CompiledNode | None]]:
    """The site's source nodes from its producer backwards (see :func:`producer_order`)."""
    return [(name, file.nodes.get(name)) for name in producer_order(file, site)]


def call_at(file: CompiledFile, line: int) -> str | None:
    """The extern op whose call is at ``line`` (an allocation there is the op's own).

    A map recorded before memest kept call lines (``CompiledFile.calls`` empty) says only where
    buffers are allocated; there the op is inferred: Inductor writes an extern op's output
    allocation, its "Source Nodes" comment and the call on consecutive lines, so a line at most
    ``_CALL_AFTER_ALLOC`` below an allocation site written by an ``extern_kernels`` op, with no
    site between, is that op's call.
    """
    if file.calls:
        return next((c.kernel for c in file.calls if c.line == line), None)
    above = [s for s in file.sites if s.line < line]
    if not above:
        return None
    prev = max(above, key=lambda s: s.line)
    kernel = prev.kernel or ""
    if kernel.startswith("extern_kernels.") and 0 < line - prev.line <= _CALL_AFTER_ALLOC:
        return kernel
    return None


_CALL_AFTER_ALLOC = 2  # the allocation, its comment, the call


def site_descriptor(file: CompiledFile, site: CompiledSite | None, line: int) -> str | None:
    """What the generated code's structure says of an allocation no source node names.

    - ``call <op>``: made inside an extern op's call, not at an allocation line (the op's own
      memory: cuBLAS allocates its per-stream workspace on a stream's first GEMM);
    - ``unwritten``: a buffer the generated function allocates and never writes, handed to its
      caller (under vLLM's piecewise split: the output of the splitting op that follows);
    - ``input of <module>``: a buffer written by a kernel whose comment lists no source node and
      allocated right before an extern op whose listed nodes read nothing listed (the buffer is
      that op's input; the op's producer node names the module).
    """
    if site is None:
        kernel = call_at(file, line)
        return f"call {kernel}" if kernel else None
    if site.nodes:
        return None
    if site.kernel is None:
        return "unwritten"
    after = [s for s in file.sites if s.line > site.line]
    nxt = min(after, key=lambda s: s.line) if after else None
    if nxt is None or not (nxt.kernel or "").startswith("extern_kernels.") or not nxt.nodes:
        return None
    listed = set(nxt.nodes)
    producer = file.nodes.get(producer_order(file, nxt)[0])
    if producer is None or not producer.module or listed & set(producer.inputs):
        return None
    return f"input of {producer.module}"


def unnamed_reason(file: CompiledFile, site: CompiledSite | None, line: int = -1) -> str:
    """Why a compiled allocation has no owner, in the owner label's words."""
    described = site_descriptor(file, site, line)
    if described is not None:
        return f"no rule for {_LAYER_INDEX.sub('.*', described)}"
    if site is None:
        return "not an allocation site"
    if not site.nodes:
        return "no source node recorded"
    if not file.nodes:
        return NO_MODULE_MAP
    modules = [n.module for _, n in site_nodes(file, site) if n is not None and n.module]
    if modules:
        return f"no rule for {_LAYER_INDEX.sub('.*', modules[0])}"
    return "no module recorded for " + producer_order(file, site)[0]


#: The reason of compiled code whose FX graph memest did not see (compiled in an earlier start
#: without memest, and no kept map in MEMEST_CODE_MAP_DIR).
NO_MODULE_MAP = "no module map recorded"


_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")
