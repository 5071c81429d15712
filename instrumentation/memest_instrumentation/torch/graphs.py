"""Wrap ``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end`` so tags mark capture windows.

While a graph captures, the current tag gains ``win=<n>`` (and ``pool=<id>`` when the caller
passed a pool, as vLLM does); the window is recorded as a capture window (one per graph: the
analysis counts graphs from them). torch answers ``CUDAGraph.pool()`` only after a successful
capture, so a pool created by capture_begin itself is written into the window at capture_end.
Patch and unpatch sit together; ``install()`` / ``uninstall()`` are idempotent and
reference-counted.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from memest.snapshot.tags import pool_key
from memest_instrumentation.torch import _compat, tagging

_LOCK = threading.Lock()
_users = 0
_originals: dict[str, Any] = {}
_TOKEN_ATTR = "_memest_capture_token"
_window_ids = itertools.count(1)
errors: list[str] = []  # hook failures (fail open), read into Recorder.warnings
_MAX_ERRORS = 20


def _note(exc: BaseException) -> None:
    if len(errors) < _MAX_ERRORS:
        errors.append(f"graph hook failed: {type(exc).__name__}: {exc}")


def _pool_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    pool = kwargs.get("pool", args[0] if args else None)
    if pool is None:
        return None
    pool = getattr(pool, "id", pool)  # torch.cuda.MemPool
    if isinstance(pool, (tuple, list)) and len(pool) == 2:
        return pool_key(tuple(pool))
    return None


def _wrap_begin(original: Any) -> Any:
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            window = next(_window_ids)
            pool = _pool_arg(args, kwargs)
            tag = tagging.current_tag().with_(pool=pool, window=window)
            token = tagging.push_tag(tag, "capture", window=window, pool=pool)
            setattr(self, _TOKEN_ATTR, token)
        except Exception as exc:  # fail open: never break a capture for a tag
            _note(exc)
        return result

    capture_begin.__wrapped__ = original  # type: ignore[attr-defined]
    return capture_begin


def _wrap_end(original: Any) -> Any:
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            token = getattr(self, _TOKEN_ATTR, None)
            if token is not None:
                try:
                    delattr(self, _TOKEN_ATTR)
                    record = tagging.window_of(token)
                    if record is not None and record.get("pool") is None:
                        record["pool"] = _compat.graph_pool_id(self)
                except Exception:  # fail open: a failed capture has no pool to report
                    pass
                try:
                    tagging.pop_tag(token)
                except Exception as exc:  # fail open
                    _note(exc)

    capture_end.__wrapped__ = original  # type: ignore[attr-defined]
    return capture_end


def install() -> bool:
    """Patch CUDAGraph (first caller only); returns False when torch has no such class."""
    global _users
    with _LOCK:
        if _users == 0:
            cls = _compat.graph_class()
            begin = cls.__dict__.get("capture_begin")
            end = cls.__dict__.get("capture_end")
            if begin is None or end is None:
                return False
            _originals["capture_begin"] = begin
            _originals["capture_end"] = end
            cls.capture_begin = _wrap_begin(begin)
            cls.capture_end = _wrap_end(end)
        _users += 1
        return True


def uninstall() -> None:
    """Undo install() once the last user is gone."""
    global _users
    with _LOCK:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and _originals:
            cls = _compat.graph_class()
            cls.capture_begin = _originals.pop("capture_begin")
            cls.capture_end = _originals.pop("capture_end")


def installed() -> bool:
    return _users > 0
