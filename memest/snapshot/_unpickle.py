"""A pickle reader that admits builtin containers and scalars only.

torch's ``_dump_snapshot`` writes a pickle of plain dicts, lists, tuples, strings and numbers.
Those need no global at all; any global a pickle names (``os.system``, a torch class, ...) is
refused before it can be looked up or called, so a hostile file cannot run code.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

from memest.errors import SnapshotFormatError


def _bytearray_from_data(*args: Any) -> bytearray:
    """``bytearray`` as protocols 0-2 rebuild it, from data only.

    ``bytearray(n)`` allocates n bytes from a few bytes of pickle (48 bytes ask for 2 GiB), so a
    size argument is refused: the result is never larger than the pickle that carried it.
    """
    if not args:
        return bytearray()
    if isinstance(args[0], bytes | str) and len(args) <= 2:
        return bytearray(*args)
    raise SnapshotFormatError("refused bytearray(size): snapshots carry data, not sizes")


# Builtins that protocols 0-2 reach through a global (protocol 4 has opcodes for the sets).
# set / frozenset take an iterable already in the pickle, so they cannot grow beyond it.
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): _bytearray_from_data,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("__builtin__", "bytearray"): _bytearray_from_data,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return _ALLOWED_GLOBALS[(module, name)]
        raise SnapshotFormatError(
            f"refused pickle global {module}.{name}: snapshots may hold only builtin "
            "containers and scalars"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotFormatError("refused pickle persistent id: not a plain snapshot")


def safe_loads(data: bytes | bytearray, *, source: str = "snapshot") -> Any:
    """Unpickle ``data`` admitting only builtin containers and scalars.

    Raises:
        SnapshotFormatError: the pickle names a global, is truncated or is not a pickle.
    """
    return safe_load(io.BytesIO(data), source=source)


def safe_load(file: IO[bytes], *, source: str = "snapshot") -> Any:
    """As safe_loads, reading the pickle from ``file`` (never held whole)."""
    try:
        return _RestrictedUnpickler(file).load()
    except SnapshotFormatError as exc:
        raise SnapshotFormatError(f"{source}: {exc}") from None
    except EOFError:
        raise SnapshotFormatError(f"{source}: truncated pickle (ended early)") from None
    except (
        pickle.UnpicklingError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        OverflowError,
    ) as exc:
        raise SnapshotFormatError(f"{source}: corrupt or truncated pickle ({exc})") from None
    except RecursionError:
        raise SnapshotFormatError(f"{source}: pickle nested too deeply") from None
    except MemoryError:
        raise SnapshotFormatError(f"{source}: pickle asks for more memory than exists") from None
