"""Decode a JSON snapshot from text chunks, with memory bounded by the content rather than by
``json.loads``.

``json.loads`` holds the whole text, then a Python int (28-32 bytes plus an 8-byte list slot) per
event value: about six times the file. Here the text is read a chunk at a time; each column of
the top-level ``events`` object goes into an ``array`` of the narrowest integer type its values
need (a value's digits and comma never take fewer bytes than its type), and every other value is
decoded whole with the stdlib decoder, which it needs anyway.
"""

from __future__ import annotations

import codecs
import json
import re
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from memest.errors import SnapshotFormatError

_DECODER = json.JSONDecoder()
_NOT_WS = re.compile(r"[^ \t\n\r]")
_NOT_INT_TEXT = re.compile(r"[^0-9, \t\n\r-]")
# Text decoded into a list at a time: its ints (36 bytes a value) are the reader's largest transient.
_PIECE_CHARS = 1 << 16
# Integer array types, narrowest first, with the range each holds ('i' and 'q' as on every
# platform CPython supports: 4 and 8 bytes).
_TYPES = tuple(
    (code, lo, hi)
    for code in ("b", "h", "i", "q", "Q")
    for bits in [8 * array(code).itemsize]
    for lo, hi in [
        (0, 2**bits - 1) if code.isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    ]
)

if TYPE_CHECKING:
    IntColumn: TypeAlias = "array[int] | list[int]"


def _narrowest(lo: int, hi: int) -> str | None:
    for code, low, high in _TYPES:
        if low <= lo and hi <= high:
            return code
    return None


class _Column:
    """An integer column that widens (one copy) when a value does not fit its type; a Python
    list only when no 64-bit type holds both its least and its largest value."""

    def __init__(self) -> None:
        self.data: IntColumn = array("b")
        self.lo = 0
        self.hi = 0

    def extend(self, values: list[int]) -> None:
        if not values:
            return
        lo, hi = min(values), max(values)
        if lo < self.lo or hi > self.hi:
            self.lo, self.hi = min(lo, self.lo), max(hi, self.hi)
            code = _narrowest(self.lo, self.hi)
            if code is None:
                self.data = list(self.data)
            elif isinstance(self.data, array) and code != self.data.typecode:
                self.data = array(code, self.data)
        self.data.extend(values)


def compact_column(values: list[int]) -> IntColumn:
    """``values`` in the narrowest integer array that holds them (unchanged when none does)."""
    column = _Column()
    column.extend(values)
    return column.data


class _Text:
    """UTF-8 text decoded from byte chunks and consumed from the front; positions in errors are
    reported as json.loads reports them (line and column of the whole text)."""

    def __init__(self, chunks: Iterator[bytes], source: str) -> None:
        self.chunks = chunks
        self.source = source
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.n_bytes = 0  # bytes fed to the decoder
        self.lines = 0  # newlines before buf
        self.col_base = 0  # characters between the last newline before buf and buf

    def fill(self, want: int = 1) -> bool:
        """Append at least ``want`` more characters (fewer at the end); False at the end."""
        if self.eof:
            return False
        dropped = self.buf[: self.pos]
        newlines = dropped.count("\n")
        if newlines:
            self.lines += newlines
            self.col_base = len(dropped) - dropped.rfind("\n") - 1
        else:
            self.col_base += len(dropped)
        parts = [self.buf[self.pos :]]
        got = 0
        while got < want and not self.eof:
            piece = next(self.chunks, None)
            pending = len(self.decoder.getstate()[0])
            try:
                text = self.decoder.decode(piece or b"", final=piece is None)
            except UnicodeDecodeError as exc:
                offset = self.n_bytes - pending + exc.start
                raise SnapshotFormatError(
                    f"{self.source}: not UTF-8 text (invalid byte at offset {offset})"
                ) from None
            self.n_bytes += len(piece or b"")
            self.eof = piece is None
            parts.append(text)
            got += len(text)
        self.buf = "".join(parts)
        self.pos = 0
        return got > 0 or not self.eof

    def syntax(self, pos: int, message: str) -> SnapshotFormatError:
        line = self.lines + 1 + self.buf.count("\n", 0, pos)
        last = self.buf.rfind("\n", 0, pos)
        col = pos - last if last >= 0 else self.col_base + pos + 1
        return SnapshotFormatError(
            f"{self.source}: invalid or truncated JSON at line {line} column {col} ({message})"
        )

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end), left unconsumed."""
        while True:
            m = _NOT_WS.search(self.buf, self.pos)
            if m is not None:
                self.pos = m.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)
            if not self.fill():
                return ""

    def expect(self, char: str, message: str) -> None:
        if self.peek() != char:
            raise self.syntax(self.pos, message)
        self.pos += 1

    def value(self) -> Any:
        """One JSON value of any kind, decoded whole."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # Perhaps cut by the chunk's end: read on, doubling, so a large value is
                # decoded a bounded number of times.
                offset = exc.pos - self.pos  # fill moves the value to the buffer's start
                if self.fill(max(len(self.buf) - self.pos, 1 << 16)):
                    continue
                raise self.syntax(self.pos + offset, exc.msg) from None
            except RecursionError:
                raise SnapshotFormatError(f"{self.source}: JSON nested too deeply") from None
            except ValueError:
                raise SnapshotFormatError(
                    f"{self.source}: JSON holds an integer with too many digits"
                ) from None
            if end == len(self.buf) and self.fill():
                continue  # a number may go on in the next chunk
            self.pos = end
            return obj

    def int_column(self, where: str) -> IntColumn:
        """A JSON array of integers (the '[' is next) into a compact column."""
        self.expect("[", "Expecting value")
        column = _Column()
        first = True
        while True:
            window = self.pos + _PIECE_CHARS
            end = self.buf.find("]", self.pos, window)
            last = end >= 0
            if last:
                piece, after = self.buf[self.pos : end], end + 1
            else:
                cut = self.buf.rfind(",", self.pos + 1, window)
                if cut < 0:
                    if len(self.buf) >= window:  # no comma in a whole piece: not a number
                        raise SnapshotFormatError(f"{where}: expected integers only")
                    if not self.fill():
                        raise self.syntax(len(self.buf), "Expecting ',' delimiter")
                    continue
                piece, after = self.buf[self.pos : cut], cut
            start = self.pos
            if not first:  # pieces after the first start at the comma that ends the last
                piece = piece[1:]
            if _NOT_INT_TEXT.search(piece):
                raise SnapshotFormatError(f"{where}: expected integers only")
            if not piece.strip() and not (first and last):
                raise self.syntax(after, "Expecting value")
            try:
                values = json.loads(f"[{piece}]")
            except json.JSONDecodeError as exc:
                raise self.syntax(start + max(exc.pos - 1, 0), exc.msg) from None
            except ValueError:
                raise SnapshotFormatError(
                    f"{self.source}: JSON holds an integer with too many digits"
                ) from None
            column.extend(values)
            self.pos = after
            first = False
            if last:
                return column.data


def read_json(chunks: Iterator[bytes], *, source: str) -> Any:
    """Decode the JSON text in ``chunks``; a top-level ``events`` object's integer arrays become
    compact columns (array('b' ... 'Q'))."""
    text = _Text(chunks, source)
    if text.peek() != "{":
        obj = text.value()
    else:
        obj = _object(text, top=True)
    if text.peek():
        raise text.syntax(text.pos, "Extra data")
    return obj


def _object(text: _Text, *, top: bool, where: str = "") -> dict[str, Any]:
    text.expect("{", "Expecting value")
    out: dict[str, Any] = {}
    if text.peek() == "}":
        text.pos += 1
        return out
    while True:
        if text.peek() != '"':
            raise text.syntax(text.pos, "Expecting property name enclosed in double quotes")
        key = text.value()
        text.expect(":", "Expecting ':' delimiter")
        nxt = text.peek()
        if top and key == "events" and nxt == "{":
            out[key] = _object(text, top=False, where=f"{text.source}.events")
        elif where and nxt == "[":
            out[key] = text.int_column(f"{where}.{key}")
        else:
            out[key] = text.value()
        nxt = text.peek()
        text.pos += 1
        if nxt == "}":
            return out
        if nxt != ",":
            raise text.syntax(text.pos - 1, "Expecting ',' delimiter")
