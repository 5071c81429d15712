"""A pickle reader that admits builtin containers and scalars only.

torch's ``_dump_snapshot`` writes a pickle of plain dicts, lists, tuples, strings and numbers.
Those need no global at all; any global a pickle names (``os.system``, a torch class, ...) is
refused before it can be looked up or called, so a hostile file cannot run code.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from memest.errors import SnapshotFormatError

# Builtins that protocols 0-2 reach through a global (protocol 4 has opcodes for the sets).
_ALLOWED_GLOBALS = frozenset(
    {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("__builtin__", "set"),
        ("__builtin__", "frozenset"),
    }
)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise SnapshotFormatError(
            f"refused pickle global {module}.{name}: snapshots may hold only builtin "
            "containers and scalars"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotFormatError("refused pickle persistent id: not a plain snapshot")


def safe_loads(data: bytes, *, source: str = "snapshot") -> Any:
    """Unpickle ``data`` admitting only builtin containers and scalars.

    Raises:
        SnapshotFormatError: the pickle names a global, is truncated or is not a pickle.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data)).load()
    except SnapshotFormatError as exc:
        raise SnapshotFormatError(f"{source}: {exc}") from None
    except EOFError:
        raise SnapshotFormatError(f"{source}: truncated pickle (ended early)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise SnapshotFormatError(f"{source}: corrupt or truncated pickle ({exc})") from None
