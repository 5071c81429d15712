"""The current stage tag of this thread, mirrored into the allocator's per-event metadata.

Phases, stages and CUDA-graph capture windows push a tag and pop it on exit, exceptions included.
Each push/pop is also kept as a time window, so a torch without per-event metadata can still be
split by time (memest.analysis reads the windows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memest.snapshot.tags import StageTag, format_tag, parse_tag
from memest_instrumentation.torch import _compat

__all__ = [
    "StageTag",
    "current_tag",
    "format_tag",
    "parse_tag",
    "pop_tag",
    "push_tag",
    "tagged",
    "windows_since",
]

MAX_WINDOWS = 200_000


@dataclass
class _State:
    apply: bool = False  # mirror tags into torch (set once history recording can use them)


_STATE = _State()
_LOCAL = threading.local()
_WINDOWS: list[dict[str, Any]] = []
_WINDOWS_LOCK = threading.Lock()
_window_base = 0  # windows dropped from the front when MAX_WINDOWS is exceeded


def _stack() -> list[tuple[StageTag, dict[str, Any]]]:
    st: list[tuple[StageTag, dict[str, Any]]] | None = getattr(_LOCAL, "stack", None)
    if st is None:
        st = []
        _LOCAL.stack = st
    return st


def current_tag() -> StageTag:
    """This thread's current tag (empty outside any phase or stage)."""
    st = _stack()
    return st[-1][0] if st else StageTag()


def _apply(tag: StageTag) -> None:
    if _STATE.apply:
        try:
            _compat.set_metadata(format_tag(tag))
        except Exception:  # fail open: tagging must never break the host program
            _STATE.apply = False


def set_apply(enabled: bool) -> None:
    _STATE.apply = enabled
    if enabled:
        _apply(current_tag())


def push_tag(tag: StageTag, kind: str, **fields: Any) -> int:
    """Make ``tag`` current; returns a token for pop_tag (``fields`` go into the window)."""
    global _window_base
    window = {
        "kind": kind,
        "tag": format_tag(tag),
        "start_us": time.time_ns() // 1000,
        "end_us": None,
        **fields,
    }
    with _WINDOWS_LOCK:
        _WINDOWS.append(window)
        drop = len(_WINDOWS) - MAX_WINDOWS
        if drop > 0:
            del _WINDOWS[:drop]
            _window_base += drop
    st = _stack()
    st.append((tag, window))
    _apply(tag)
    return len(st)


def window_of(token: int) -> dict[str, Any] | None:
    """The window record opened by the push that returned ``token`` (still open)."""
    st = _stack()
    return st[token - 1][1] if 0 < token <= len(st) else None


def pop_tag(token: int) -> None:
    """Restore the tag that was current before the push that returned ``token``."""
    st = _stack()
    while len(st) >= token and st:
        _, window = st.pop()
        window["end_us"] = time.time_ns() // 1000
    _apply(current_tag())


@contextmanager
def tagged(tag: StageTag, kind: str = "stage") -> Iterator[StageTag]:
    token = push_tag(tag, kind)
    try:
        yield tag
    finally:
        pop_tag(token)


def window_mark() -> int:
    with _WINDOWS_LOCK:
        return _window_base + len(_WINDOWS)


def windows_since(mark: int) -> list[dict[str, Any]]:
    """Windows opened since ``window_mark()`` returned ``mark`` (copies)."""
    with _WINDOWS_LOCK:
        start = max(0, mark - _window_base)
        return [dict(w) for w in _WINDOWS[start:]]
