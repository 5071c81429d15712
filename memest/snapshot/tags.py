"""The stage tag: the per-event allocator metadata string that carries phase, stage and pool.

The recorder stamps every allocator event with one string (``_set_memory_metadata``). memest's
tags look like ``memest/1;phase=capture;stage=target.full;size=512;pool=0,1``. A tag written by
someone else (any other non-empty string) is read as a stage name with no phase, so foreign
metadata still splits the breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TAG_PREFIX = "memest/1"
_FORBIDDEN = str.maketrans({";": "_", "=": "_"})


@dataclass(frozen=True, slots=True)
class StageTag:
    """What one allocator event was doing.

    Attributes:
        phase: startup window (weights, profile_run, graph_profiling, capture, ...), "" if none.
        stage: capture routine (target.piecewise, target.full, ...), "" if none.
        capture_size: the capture size (tokens or requests) being captured, if known.
        pool: graph pool id "a,b" while inside a CUDAGraph capture window, if known at its start.
        window: sequence number of the CUDAGraph capture window the event falls in, if any;
            the window record in the snapshot names the pool when it was learnt only at the
            window's end (torch answers CUDAGraph.pool() only after a successful capture).
    """

    phase: str = ""
    stage: str = ""
    capture_size: int | None = None
    pool: str | None = None
    window: int | None = None

    def with_(self, **changes: object) -> StageTag:
        """A copy with some fields changed (``None`` values keep the field as is)."""
        kept = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **kept)  # type: ignore[arg-type]

    @property
    def empty(self) -> bool:
        return not (
            self.phase
            or self.stage
            or self.pool
            or self.capture_size is not None
            or self.window is not None
        )


def pool_key(pool: object) -> str:
    """Normalise a torch pool id (tuple ``(0, 1)``, list, or ``"0,1"``) to ``"0,1"``."""
    if isinstance(pool, str):
        return pool.replace(" ", "").strip("()[]").replace("_", ",")
    if isinstance(pool, (tuple, list)):
        return ",".join(str(int(p)) for p in pool)
    return str(pool)


DEFAULT_POOL = "0,0"


def format_tag(tag: StageTag) -> str:
    """Encode a tag for ``_set_memory_metadata``; the empty tag encodes as ``""``."""
    if tag.empty:
        return ""
    parts = [TAG_PREFIX]
    if tag.phase:
        parts.append("phase=" + tag.phase.translate(_FORBIDDEN))
    if tag.stage:
        parts.append("stage=" + tag.stage.translate(_FORBIDDEN))
    if tag.capture_size is not None:
        parts.append(f"size={int(tag.capture_size)}")
    if tag.pool is not None:
        parts.append("pool=" + tag.pool.translate(_FORBIDDEN))
    if tag.window is not None:
        parts.append(f"win={int(tag.window)}")
    return ";".join(parts)


def parse_tag(text: str | None) -> StageTag:
    """Decode a ``user_metadata`` string; foreign strings become a stage name."""
    if not text:
        return StageTag()
    if not text.startswith(TAG_PREFIX + ";") and text != TAG_PREFIX:
        return StageTag(stage=text)
    fields: dict[str, str] = {}
    for part in text.split(";")[1:]:
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return StageTag(
        phase=fields.get("phase", ""),
        stage=fields.get("stage", ""),
        capture_size=_int(fields.get("size")),
        pool=fields.get("pool") or None,
        window=_int(fields.get("win")),
    )


def _int(text: str | None) -> int | None:
    if text is None or not text.lstrip("-").isdigit():
        return None
    return int(text)
