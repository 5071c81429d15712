"""Formatting helpers every surface shares over RunReports: how a run's definition, phases and
notes read. The figures come from memest.analysis (runs, compare, history) and
memest.estimate.account; this module only words and lays them out. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, Field

from memest.builds.compare import Comparison
from memest.builds.compare import compare as compare_runs
from memest.identity import model_display_name
from memest.reporters.owners import owner_label
from memest.schema import PhaseRecord, RunReport, StartAccounting
from memest.schema.breakdown import PhaseSplit
from memest.units import fmt_gib


def compare(a: RunReport, b: RunReport) -> Comparison:
    """``memest.builds.compare.compare`` with owners named as every surface names them."""
    return compare_runs(a, b, owner_label=owner_label)


def definition_line(report: RunReport, accounting: StartAccounting) -> str:
    """What a start's figures are when memest cannot recompute them (empty when it can):
    published figures say so, a measured start says it was measured by an older definition."""
    if accounting.definition != "stored":
        return ""
    note = accounting.definition_note
    reason = note.split(": ", 1)[1] if ": " in note else note
    if report.source == "published":
        return f"Published figures, not measured by memest: {short_paths(reason)}"
    return f"Measured by an older definition: {short_paths(reason)}"


def model_name(model: str) -> str:
    """The model as users know it (a local folder shows as its name): identity's one rule."""
    return model_display_name(model)


#: A capture plan's sizing in words: "seed" is the proposal that sizes capture from five
#: fields (memest.plan.seed), a name a reader of a page cannot know.
SIZING_WORDS = {
    "seed": "the proposed sizing from five capture fields",
    "vllm-0.33.0": "vLLM 0.33.0's own sizing",
}


def sizing_words(sizing: str) -> str:
    """A capture plan's sizing as a page names it."""
    return SIZING_WORDS.get(sizing, f"{sizing} sizing")


#: Who sized a start's KV cache (kv_sized_by), as a page names it after "KV cache sized by".
SIZED_BY_WORDS = {
    "vllm": "vLLM",
    "memest": "memest (MEMEST_ESTIMATE=apply)",
    "memest-plan": "a fixed --kv-cache-memory-bytes (startup plan)",
}


def sized_by_words(sized_by: str | None) -> str:
    """``kv_sized_by`` as a page names it; "not recorded" when the report does not say."""
    return "not recorded" if sized_by is None else SIZED_BY_WORDS.get(sized_by, sized_by)


#: Terms only one model family has (memest.estimate.phases): a zero row of one is left off
#: the tables of every other model.
FAMILY_TERMS = {"mla_context_bytes": "mla"}


#: Startup phases as an operator knows them (the plugin names them after vLLM's functions).
PHASE_WORDS = {
    "init_device": "GPU and CUDA libraries set up",
    "weights": "model weights loaded",
    "determine_available_memory": "memory profiling (vLLM sizes its KV budget)",
    "profile_run": "profile run at max_num_batched_tokens",
    "profile_run.warm": "memest's second, warm profile run",
    "graph_profiling.total": "CUDA-graph memory profiling",
    "graph_profiling.kv": "its temporary KV cache",
    "graph_profiling": "its trial graph capture",
    "initialize_from_config": "KV cache set up",
    "kv_cache_alloc": "KV cache allocated",
    "compile_or_warm_up_model": "compile, warm-up and CUDA-graph capture",
    "capture": "CUDA-graph capture",
    "end": "end of startup",
}


def phase_words(phase: str) -> str:
    """A startup phase as a page names it (vLLM's function name when it has no words)."""
    return PHASE_WORDS.get(phase, phase)


class PhaseRow(BaseModel):
    """A phase's added memory, with the phase it runs inside (its bytes are in that one too)."""

    split: PhaseSplit
    depth: int = 0
    parent: str | None = None


def phase_rows(splits: Sequence[PhaseSplit], records: Sequence[PhaseRecord]) -> list[PhaseRow]:
    """The phase split as a tree, from the phase windows: outer phases first, then the phases
    that run inside them (kv_cache_alloc inside initialize_from_config, ...). Only rows at depth
    0 add up; a phase without a window is a top-level row at the end."""
    windows = {r.name: (r.start.time_ns, r.end.time_ns) for r in records}
    timed = sorted(
        (s for s in splits if s.phase in windows),
        key=lambda s: (windows[s.phase][0], -windows[s.phase][1]),
    )
    rows: list[PhaseRow] = []
    stack: list[str] = []
    for split in timed:
        start, end = windows[split.phase]
        while stack and not (windows[stack[-1]][0] <= start and end <= windows[stack[-1]][1]):
            stack.pop()
        rows.append(PhaseRow(split=split, depth=len(stack), parent=stack[-1] if stack else None))
        stack.append(split.phase)
    rows += [PhaseRow(split=s) for s in splits if s.phase not in windows]
    return rows


#: How nested phase rows read; every surface that nests phases says this.
NESTED_NOTE = (
    "↳ A phase whose window lies inside the window of the phase it names: that phase's row is "
    "the net change over its whole window, so it already holds what the inner phase kept, and "
    "memest nets out what the inner phase added and the outer one freed before it ended (the "
    "graph-memory profiling throws away its KV cache and graphs), which is why an inner row can "
    "be larger than its outer one; only the unindented rows add up"
)

#: Why a phase's category can be negative; every surface that shows one says this.
NEGATIVE_NOTE = (
    "Negative: the phase gave memory back. PyTorch's cache shrank (empty_cache() returned "
    "cached blocks to the device) or memory outside PyTorch was freed; the phase's total "
    "already nets it out"
)


class Notes(BaseModel):
    """A report's notes for a page: the few that matter, and the diagnostics behind them."""

    shown: list[str]
    more: list[str]
    main: list[str] = Field(default_factory=list, description="Every note but the diagnostics")
    diagnostics: list[str] = Field(
        default_factory=list, description="The plugin's diagnostics (history stage rows, files)"
    )


#: Notes that are diagnostics of the plugin (per-stage history rows, where files were kept).
_DIAGNOSTIC = ("history stage row:", "allocator history kept at", "allocator history off")
#: An absolute path: shown as its file name only (no host folders on a page).
_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/:;,()]+/)+([^\s/:;,()]+)")
#: A byte figure in a plugin note ("570428928 B", "132096694682 -> 131000000000 B").
_BYTES = re.compile(r"(?<![\w.])(-?\d+)(?: -> (-?\d+))? B\b")
#: The plugin's name for what vLLM logged as its graph estimate, and every surface's name for it.
_LOGGED = ("graph memory: vLLM estimate ", "graph memory: vLLM's logged graph estimate ")


def short_paths(text: str) -> str:
    """``text`` with each absolute path cut to its file name."""
    return _PATH.sub(lambda m: m.group(1), text)


def _gib_figure(m: re.Match[str]) -> str:
    first = fmt_gib(int(m.group(1)))
    return f"{first} GiB" if m.group(2) is None else f"{first} -> {fmt_gib(int(m.group(2)))} GiB"


def readable_note(text: str) -> str:
    """A plugin note as surfaces show it: paths cut to file names, byte figures in GiB
    (``memest.units.fmt_gib``), vLLM's logged graph estimate named as the accounting names it."""
    return _BYTES.sub(_gib_figure, short_paths(text)).replace(*_LOGGED)


def notes(report: RunReport, keep: int = 4) -> Notes:
    """Up to ``keep`` notes worth reading first; the plugin's diagnostics and the rest after."""
    lines = [readable_note(n) for n in report.notes]
    main = [n for n in lines if not n.startswith(_DIAGNOSTIC)]
    rest = [n for n in lines if n.startswith(_DIAGNOSTIC)]
    return Notes(shown=main[:keep], more=main[keep:] + rest, main=main, diagnostics=rest)
