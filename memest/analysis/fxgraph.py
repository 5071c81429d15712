"""vLLM's ``computation_graph.py``: the FX graph behind generated code loaded from a compile cache.

A start that loads its torch.compile output from vLLM's cache (filled by a start without memest)
never shows memest the FX graph the code came from, so no node map was recorded for it. The cache
still holds that graph as text: vLLM writes ``split_gm.print_readable()`` to
``<compile cache>/rank_<r>_<dp>/<prefix>/computation_graph.py``, one ``class submod_<n>`` per
piece of the split graph, each node one statement under a comment naming its innermost frame::

    # File: /site/vllm/model_executor/parameter.py:124 in __torch_function__, code: return ...
    linear: "bf16[s72, 6144]" = torch._C._nn.linear(rms_norm_default, l_self_modules_layers_...

:func:`parse_split_graph` reads that text with ``ast`` (nothing is executed) into one
:class:`GraphPiece` per submodule: for each node its module path, frame, op and inputs, as the
plugin records them from a live graph (``CompiledNode``). The text carries no
``nn_module_stack``; a node's module path is read from the parameters and buffers it reads, whose
placeholder names encode it (``l_self_modules_layers_modules_0_modules_self_attn_modules_qkv_proj_
parameters_weight_`` is ``layers.0.self_attn.qkv_proj``), directly or through a node that reads
parameters only (``_get_data_attr(weight)``). A node that reads no parameter (an activation, a
view) gets no module; its frame still names the code.

:func:`match_piece` finds the submodule a generated module was compiled from: the one that holds
the node names its "Source Nodes" comments list (:func:`memest.analysis.inductor.listed_names`),
the smallest such one first (the last decoder piece holds fewer nodes than a middle one), then
the first in the graph (identical middle pieces share one generated module; the first compiled it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from memest.schema.report import CompiledNode

#: The file vLLM 0.33.0 writes the split graph to, inside each compile cache's local folder.
GRAPH_FILE = "computation_graph.py"
#: Share of a generated module's listed node names a submodule must hold to be its source.
MIN_COVERAGE = 0.8

_PARAM = re.compile(r"^[lL]_self_(?P<mods>.*?)_?(?:parameters|buffers)_(?P<attr>.+)_$")
_FRAME = re.compile(r"File: (?P<file>.+?):(?P<line>\d+) in (?P<func>\S+), code: (?P<code>.*)$")
_NO_FRAME = "No stacktrace found"
_OPERATORS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "truediv",
    ast.FloorDiv: "floordiv",
    ast.Mod: "mod",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.USub: "neg",
}
_Frame = tuple[str, int, str, str]


@dataclass
class GraphPiece:
    """One submodule of vLLM's split graph: its node names and the map of its nodes."""

    source: str  # which computation_graph.py (a label for notes)
    name: str  # submod_<n>
    order: int  # position in the file
    names: frozenset[str]  # every node the submodule computes (mapped or not)
    nodes: dict[str, CompiledNode] = field(default_factory=dict)


def param_module(placeholder: str) -> str | None:
    """Module path a parameter or buffer placeholder's name encodes, else None.

    ``l_self_modules_layers_modules_0_modules_mlp_modules_down_proj_parameters_weight_`` ->
    ``layers.0.mlp.down_proj`` (Dynamo's ``L['self']._modules['layers']._modules['0']...``).
    """
    m = _PARAM.match(placeholder)
    if m is None:
        return None
    mods = m.group("mods")
    if not mods.startswith("modules_"):
        return None  # a parameter of the root module: no path
    return ".".join(mods[len("modules_") :].split("_modules_")) or None


def _frame_of(comment: str) -> tuple[bool, _Frame | None]:
    """(is a frame comment, the frame) of one comment line."""
    m = _FRAME.search(comment)
    if m:
        return True, (m.group("file"), int(m.group("line")), m.group("func"), m.group("code"))
    return _NO_FRAME in comment, None


def _names_in_order(node: ast.AST) -> Iterator[str]:
    """Names an expression reads, in source order."""
    found = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    for n in found:
        yield n.id


def _dotted(node: ast.expr) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return []


def _target(value: ast.expr, local: set[str]) -> str | None:
    """The op a node calls, in the plugin's words (``CompiledNode.target``)."""
    if isinstance(value, ast.Subscript):
        return "_operator.getitem"
    if isinstance(value, (ast.BinOp, ast.UnaryOp)):
        name = _OPERATORS.get(type(value.op))
        return f"_operator.{name}" if name else None
    if not isinstance(value, ast.Call):
        return None
    parts = _dotted(value.func)
    if len(parts) == 2 and parts[0] in local:  # linear.split(...): a method
        return parts[1]
    return ".".join(parts) or None


@dataclass
class _Forward:
    """State of one pass over a submodule's ``forward``."""

    lines: list[str]
    scrub: Callable[[str], str]
    params: dict[str, str]  # placeholder -> module path
    local: set[str]  # placeholders and nodes so far
    getitem_of: dict[str, str] = field(default_factory=dict)
    module_of: dict[str, str] = field(default_factory=dict)
    param_only: set[str] = field(default_factory=set)
    names: dict[str, None] = field(default_factory=dict)  # every node so far, in order
    nodes: dict[str, CompiledNode] = field(default_factory=dict)
    frame: _Frame | None = None
    last_line: int = 0

    def advance(self, stmt: ast.stmt) -> None:
        """The frame of ``stmt``: the last frame comment above it, else the one before."""
        for n in range(self.last_line + 1, stmt.lineno):
            text = self.lines[n - 1].strip() if n <= len(self.lines) else ""
            if text.startswith("#"):
                is_frame, frame = _frame_of(text)
                if is_frame:
                    self.frame = frame
        self.last_line = stmt.end_lineno or stmt.lineno

    def resolve(self, name: str) -> str:
        """A node read through ``getitem`` of a multi-output node is that node (as the plugin)."""
        seen = 0
        while name in self.getitem_of and seen < 64:
            name, seen = self.getitem_of[name], seen + 1
        return name

    def add(self, name: str, value: ast.expr) -> None:
        read = [n for n in dict.fromkeys(_names_in_order(value)) if n != name]
        computed = [n for n in read if n in self.names]
        if isinstance(value, ast.Subscript) and computed:
            self.getitem_of[name] = computed[0]
        inputs = list(dict.fromkeys(self.resolve(n) for n in computed))
        modules = [self.params[n] for n in read if n in self.params]
        modules += [self.module_of[n] for n in computed if n in self.param_only]
        if modules:
            self.module_of[name] = modules[0]
            if not computed:
                self.param_only.add(name)
        self.names[name] = None
        self.local.add(name)
        module = self.module_of.get(name)
        frame = self.frame
        if not module and frame is None and not inputs:
            return
        target = _target(value, self.local)
        self.nodes[name] = CompiledNode(
            module=module,
            file=self.scrub(frame[0]) if frame else None,
            line=frame[1] if frame else None,
            function=frame[2] if frame else None,
            code=frame[3][:200] if frame else None,
            target=target[:200] if target else None,
            inputs=inputs,
        )


def _node_statement(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """(node name, expression) of ``name: "type" = expr`` / ``name = expr``; None otherwise
    (``a = b = None`` frees, ``return``)."""
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
        return stmt.target.id, stmt.value
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Name) and not isinstance(stmt.value, (ast.Constant, ast.Name)):
            return target.id, stmt.value
    return None


def _forward(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next(
        (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None
    )


def _piece(
    cls: ast.ClassDef, lines: list[str], scrub: Callable[[str], str], source: str, order: int
) -> GraphPiece | None:
    fn = _forward(cls)
    if fn is None:
        return None
    args = [a.arg for a in fn.args.args[1:]]
    params = {a: m for a in args if (m := param_module(a))}
    walk = _Forward(lines, scrub, params, set(args), last_line=fn.lineno)
    for stmt in fn.body:
        walk.advance(stmt)
        found = _node_statement(stmt)
        if found is not None:
            walk.add(*found)
    return GraphPiece(source, cls.name, order, frozenset(walk.names), walk.nodes)


def parse_split_graph(
    text: str, source: str = GRAPH_FILE, scrub: Callable[[str], str] = str
) -> list[GraphPiece]:
    """Every submodule of a ``computation_graph.py`` (``scrub`` turns a frame's file into the
    path owner rules match, as the plugin scrubs live frames).

    Raises:
        SyntaxError: the text is not Python.
    """
    tree = ast.parse(text)
    lines = text.splitlines()
    pieces: list[GraphPiece] = []
    for top in tree.body:
        if not isinstance(top, ast.ClassDef):
            continue
        for cls in top.body:
            if isinstance(cls, ast.ClassDef):
                piece = _piece(cls, lines, scrub, source, len(pieces))
                if piece is not None:
                    pieces.append(piece)
    return pieces


def match_piece(names: Sequence[str] | set[str], pieces: Sequence[GraphPiece]) -> GraphPiece | None:
    """The submodule a generated module listing ``names`` was compiled from, or None.

    The one holding most of the names (at least :data:`MIN_COVERAGE` of them); among equals the
    smallest, then the first.
    """
    wanted = set(names)
    if not wanted:
        return None
    best: tuple[int, int, int] | None = None
    found: GraphPiece | None = None
    for i, piece in enumerate(pieces):
        held = len(wanted & piece.names)
        rank = (-held, len(piece.names), i)
        if best is None or rank < best:
            best, found = rank, piece
    if found is None or best is None or -best[0] < MIN_COVERAGE * len(wanted):
        return None
    return found
