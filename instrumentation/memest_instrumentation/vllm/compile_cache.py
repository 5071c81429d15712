"""The split graph vLLM keeps in its compile cache, for generated code memest saw no graph of.

vLLM 0.33.0 writes ``split_gm.print_readable()`` to
``<compilation_config.cache_dir>/rank_<rank>_<dp>/<prefix>/computation_graph.py`` (backends.py,
``VllmBackend.__call__``; ``compilation_config.local_cache_dir`` is that folder, or the AOT
compile folder on torch's AOT path). A start that loads its code from that cache, filled by a
start without memest, has no node map recorded or kept for it; ``CacheGraphs.rebuild`` reads
those files once (at the end of init, only when a map is missing; at most ``_MAX_GRAPHS`` files
of at most ``_MAX_GRAPH_BYTES`` each) and gives the generated module the map of the submodule it
was compiled from (memest.analysis.fxgraph). Callers run it in ``guarded``: nothing here may
make a start fail.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from memest.analysis.fxgraph import GRAPH_FILE, GraphPiece, match_piece, parse_split_graph
from memest.analysis.inductor import listed_names
from memest.schema import CompiledNode
from memest.snapshot import scrub_path, scrub_roots_default

_MAX_GRAPHS = 8  # computation_graph.py files read (one per compiled prefix: backbone, drafter)
_MAX_GRAPH_BYTES = 16 << 20  # a larger file is skipped (named in notes)


def graph_files(vllm_config: Any) -> list[Path]:
    """This rank's ``computation_graph.py`` files, the current compile's first."""
    cc = getattr(vllm_config, "compilation_config", None)
    pc = getattr(vllm_config, "parallel_config", None)
    rank = getattr(pc, "rank", 0) or 0
    dp = getattr(pc, "data_parallel_index", 0) or 0
    found: list[Path] = []
    local = getattr(cc, "local_cache_dir", None)
    if local:
        found.append(Path(local) / GRAPH_FILE)
    root = getattr(cc, "cache_dir", None)
    if root:
        found += sorted(Path(root).glob(f"rank_{rank}_{dp}/*/{GRAPH_FILE}"))
    files = [p for p in dict.fromkeys(found) if p.is_file()]
    return files[:_MAX_GRAPHS]


def _label(path: Path) -> str:
    """``<hash>/rank_0_0/backbone/computation_graph.py``: the cache entry, not the machine's root."""
    return "/".join(path.parts[-4:])


class CacheGraphs:
    """The submodules of the compile cache's split graphs, read on first need."""

    def __init__(self, vllm_config: Any) -> None:
        self._config = vllm_config
        self._pieces: list[GraphPiece] | None = None

    def pieces(self, notes: list[str]) -> list[GraphPiece]:
        if self._pieces is None:
            self._pieces = []  # read once, even if reading fails part-way
            scrub = functools.partial(scrub_path, roots=scrub_roots_default())
            for path in graph_files(self._config):
                if path.stat().st_size > _MAX_GRAPH_BYTES:
                    notes.append(f"{_label(path)}: over {_MAX_GRAPH_BYTES >> 20} MiB, not read")
                    continue
                text = path.read_text(encoding="utf-8", errors="replace")
                try:
                    self._pieces += parse_split_graph(text, _label(path), scrub)
                except (SyntaxError, ValueError, RecursionError) as exc:
                    notes.append(f"{_label(path)}: not parsed ({type(exc).__name__})")
        return self._pieces

    def rebuild(self, key: str, text: str, notes: list[str]) -> dict[str, CompiledNode]:
        """The node map of generated module ``key`` (source ``text``) from the cache, or {}."""
        pieces = self.pieces(notes)
        piece = match_piece(listed_names(text), pieces) if pieces else None
        if piece is None:
            return {}
        mapped = sum(1 for n in piece.nodes.values() if n.module)
        notes.append(
            f"{key}: module map rebuilt from vLLM's compile cache ({piece.source}, {piece.name}: "
            f"{len(piece.nodes)} nodes, {mapped} with a module path read from the parameters "
            "they use)"
        )
        return piece.nodes
