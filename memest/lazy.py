"""Package attributes imported on first use (PEP 562), for packages the vLLM plugin imports.

The plugin imports one submodule of memest.analysis and memest.estimate in vLLM's worker; a
package ``__init__`` that imported every name would load the rest of the core there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, sources: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__``: ``sources`` maps each name to the module defining it; any other
    name is tried as a submodule. A name, once imported, is kept in ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = sources.get(name)
        if module is None:
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
