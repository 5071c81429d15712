"""Reading user-given input files with bounded memory; the only place that opens them.

Every loader (snapshots, reports, rules, grids, phase lists) reads through here, so a symlink to
``/dev/zero``, a FIFO, a gzip bomb, non-UTF-8 bytes or pathologically nested JSON is refused with
one line naming the file, never read until the machine runs out of memory.

Limits: ``MEMEST_MAX_INPUT_BYTES`` (default 2 GiB) bounds a snapshot file and its decompressed
content: a 10-million-event history in memest JSON is about 0.6 GiB; reports and small JSON inputs have fixed
limits below.
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import ValidationError

from memest.errors import ConfigError, MemestError, ReportFormatError, first_error
from memest.schema import SCHEMA_VERSION, RunReport
from memest.units import GiB, KiB, MiB, fmt_bytes, parse_bytes

MAX_INPUT_ENV = "MEMEST_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 2 * GiB
MAX_REPORT_BYTES = 256 * MiB
MAX_SMALL_JSON_BYTES = 16 * MiB
"""Rules files, grids and phase lists: a few KB in practice."""

_CHUNK_BYTES = 4 * MiB
# Streamed input is decoded a piece at a time: small enough to be noise beside the content.
STREAM_CHUNK_BYTES = 256 * KiB
_GZIP_WBITS = 16 + zlib.MAX_WBITS

ErrorFactory = Callable[[str], Exception]


class InputFileError(MemestError, ValueError):
    """An input file is missing, not a regular file, too large, or not decodable."""


def max_input_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The snapshot size limit: ``MEMEST_MAX_INPUT_BYTES`` or the default.

    Raises:
        ConfigError: the variable is set to something that is not a positive size.
    """
    env = os.environ if environ is None else environ
    text = env.get(MAX_INPUT_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_INPUT_BYTES
    value = parse_bytes(text, field=MAX_INPUT_ENV)
    if value <= 0:
        raise ConfigError(MAX_INPUT_ENV, text, "must be a positive size")
    return value


def read_regular_file(
    path: str | Path, *, limit: int, error: ErrorFactory = InputFileError
) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes.

    Symlinks are followed, but their target must be a regular file: devices, FIFOs and folders
    are refused before a byte is read (O_NONBLOCK keeps opening a FIFO from hanging).
    """
    p = Path(path)
    with open_regular_file(p, error=error) as handle:
        data = _read_at_most(handle, limit, expected=os.fstat(handle.fileno()).st_size)
    if data is None:
        raise error(f"{p}: larger than the {fmt_bytes(limit)} limit{_hint(limit)}")
    return data


def open_regular_file(path: str | Path, *, error: ErrorFactory = InputFileError) -> BinaryIO:
    """``path`` opened for reading in binary, which must be a regular file (as above)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise error(f"{p}: cannot read: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before fdopen, which refuses a folder by fd
        os.close(fd)
        raise error(f"{p}: not a regular file ({_kind(info.st_mode)})")
    return os.fdopen(fd, "rb")


def read_chunks(
    handle: BinaryIO, *, limit: int, source: str, error: ErrorFactory = InputFileError
) -> Iterator[bytes]:
    """The content of ``handle`` in chunks of at most STREAM_CHUNK_BYTES, refusing past ``limit``."""
    too_large = f"{source}: larger than the {fmt_bytes(limit)} limit{_hint(limit)}"
    if os.fstat(handle.fileno()).st_size > limit:  # refused before a byte is read
        raise error(too_large)
    total = 0
    while piece := handle.read(STREAM_CHUNK_BYTES):
        total += len(piece)
        if total > limit:  # grew meanwhile, or reports no size (as /proc does)
            raise error(too_large)
        yield piece


def _read_at_most(handle: BinaryIO, limit: int, *, expected: int) -> bytes | None:
    """The whole content, or None past ``limit``; never allocates much beyond what is read.

    ``read(n)`` reserves n bytes up front, so the first read asks for the size the file
    reports; a file that grows meanwhile (or reports 0, as /proc does) is read on in chunks.
    """
    if expected > limit:
        return None
    data = handle.read(expected + 1)
    if len(data) <= expected:
        return data
    buffer = bytearray(data)
    while len(buffer) <= limit:
        piece = handle.read(_CHUNK_BYTES)
        if not piece:
            return bytes(buffer)
        buffer += piece
    return None


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _hint(limit: int) -> str:
    try:
        configurable = limit == max_input_bytes()
    except ConfigError:
        configurable = False
    return f"; raise {MAX_INPUT_ENV} to allow more" if configurable else ""


def gunzip(
    data: bytes, *, limit: int, source: str, error: ErrorFactory = InputFileError
) -> bytearray:
    """Decompress gzip ``data`` (one or more members) in chunks, refusing output over ``limit``."""
    out = bytearray()
    for piece in gunzip_chunks(iter((data,)), limit=limit, source=source, error=error):
        out += piece
    return out


def gunzip_chunks(
    chunks: Iterator[bytes], *, limit: int, source: str, error: ErrorFactory = InputFileError
) -> Iterator[bytes]:
    """Decompress a gzip stream (one or more members) given in chunks, yielding pieces of at
    most STREAM_CHUNK_BYTES and refusing output over ``limit``."""
    total = 0
    inflater = zlib.decompressobj(_GZIP_WBITS)
    started = False  # the current member has had input
    for chunk in chunks:
        pending = chunk
        while pending or started:
            if not started and not pending.strip(b"\0"):
                break  # gzip allows zero padding after the last member
            started = True
            try:
                piece = inflater.decompress(pending, STREAM_CHUNK_BYTES)
            except zlib.error as exc:
                raise error(f"{source}: corrupt gzip ({exc})") from None
            total += len(piece)
            if total > limit:
                raise error(
                    f"{source}: decompresses to more than the {fmt_bytes(limit)} limit"
                    f"{_hint(limit)}"
                )
            if piece:
                yield piece
            pending = inflater.unconsumed_tail
            if inflater.eof:
                pending, started = inflater.unused_data, False
                inflater = zlib.decompressobj(_GZIP_WBITS)
            elif not piece and not pending:
                break  # needs the next chunk
    if started:
        raise error(f"{source}: truncated gzip (ended early)")


def gzip_head(data: bytes, n_bytes: int = 64) -> bytes:
    """The first decompressed bytes of gzip ``data`` (b"" when they cannot be decoded)."""
    try:
        return zlib.decompressobj(_GZIP_WBITS).decompress(data, n_bytes)
    except zlib.error:
        return b""


def parse_json(
    data: bytes | bytearray, *, source: str, error: ErrorFactory = InputFileError
) -> Any:
    """Decode UTF-8 JSON, naming the problem in one line (encoding, syntax, nesting, integers)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{source}: not UTF-8 text (invalid byte at offset {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{source}: invalid or truncated JSON at line {exc.lineno} column {exc.colno} "
            f"({exc.msg})"
        ) from None
    except RecursionError:
        raise error(f"{source}: JSON nested too deeply") from None
    except ValueError:  # an integer beyond Python's digit limit for conversion
        raise error(f"{source}: JSON holds an integer with too many digits") from None


def load_json_file(
    path: str | Path, *, limit: int = MAX_SMALL_JSON_BYTES, error: ErrorFactory = InputFileError
) -> Any:
    """Read and decode a JSON file through the checks above."""
    data = read_regular_file(path, limit=limit, error=error)
    return parse_json(data, source=str(path), error=error)


def load_report(path: Path) -> RunReport:
    """Read one RunReport JSON file.

    Raises:
        ReportFormatError: unreadable, not a regular file, over MAX_REPORT_BYTES, not UTF-8
            JSON, another schema version, or an invalid field (the first failing one is named).
    """
    data = load_json_file(path, limit=MAX_REPORT_BYTES, error=ReportFormatError)
    if not isinstance(data, dict):
        raise ReportFormatError(f"{path}: expected a RunReport JSON object")
    version = data.get("schema_version", SCHEMA_VERSION)  # absent: the model default
    if version != SCHEMA_VERSION:
        raise ReportFormatError(
            f"{path}: schema_version {str(version)[:20]!r}, memest reads {SCHEMA_VERSION!r}"
        )
    try:
        return RunReport.model_validate(data)
    except RecursionError:
        raise ReportFormatError(f"{path}: nested too deeply") from None
    except ValidationError as exc:
        where, message, _ = first_error(exc)
        raise ReportFormatError(f"{path}: field {where}: {message}") from None


def load_json_object(
    flag: str, text: str, *, error: ErrorFactory = InputFileError, inline: bool = True
) -> dict[str, Any]:
    """A command-line JSON object: inline JSON, or (``inline`` or not) the path of a JSON file.

    Text that starts like JSON (``{``, ``[``, a quote, a digit) is read inline; anything else is
    a path. Either way the value must be an object; the one-line error names ``flag`` and says
    whether the text was not JSON, not an object, or not a readable file.
    """
    stripped = text.strip()
    looks_inline = inline and (
        stripped[:1] in tuple('{["-0123456789') or stripped in ("true", "false", "null")
    )
    if looks_inline:
        data = parse_json(
            text.encode("utf-8", "surrogateescape"), source=f"{flag} (inline JSON)", error=error
        )
    elif inline and not Path(text).exists() and not Path(text).is_symlink():
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise error(f"{flag} {shown!r}: neither inline JSON (an object {{...}}) nor a file")
    else:
        data = load_json_file(text, error=lambda msg: error(f"{flag} {msg}"))
    if not isinstance(data, dict):
        raise error(f"{flag}: expected a JSON object {{...}}, got {_json_kind(data)}")
    return data


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return (
        "a number"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else "a boolean"
    )
