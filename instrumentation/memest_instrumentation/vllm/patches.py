"""Patch machinery: each patch names its target, the signature it expects, and its unpatch.

``instrument()`` wraps every target that exists with the expected signature and skips (and
reports) the others; ``uninstrument()`` puts every original back. Both are idempotent: a wrapped
target carries ``__memest_original__`` and is never wrapped twice, even when vLLM loads the
plugin again in the same process. ``ImportWatch`` defers a patch until vLLM imports its module,
so a process that never loads vLLM's workers never imports them for memest.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
ORIGINAL_ATTR = "__memest_original__"
PATCH_ATTR = "__memest_patch__"


@dataclass(frozen=True)
class Patch:
    """One monkeypatch on vLLM.

    Attributes:
        name: hook name (in MEMEST_FAULT and in report.hook_errors).
        module: module holding the target.
        owner: class name in that module, or None for a module-level function.
        attr: attribute patched.
        params: leading parameter names the wrapper relies on (a rename fails the check).
        make: builds the wrapper from the original.
        runner: "v2", "v1" or "both": which model runner the target serves.
    """

    name: str
    module: str
    owner: str | None
    attr: str
    params: tuple[str, ...]
    make: Wrapper
    runner: str = "both"

    @property
    def target(self) -> str:
        where = f"{self.module}.{self.owner}" if self.owner else self.module
        return f"{where}.{self.attr}"


def _holder(patch: Patch) -> Any:
    mod = importlib.import_module(patch.module)
    return getattr(mod, patch.owner) if patch.owner else mod


def current(patch: Patch) -> Any:
    """The object now at the patch target (raises if the module, class or attribute is gone)."""
    holder = _holder(patch)
    if patch.owner:
        return (
            holder.__dict__[patch.attr]
            if patch.attr in holder.__dict__
            else getattr(holder, patch.attr)
        )
    return getattr(holder, patch.attr)


def original(obj: Any) -> Any:
    """Unwrap memest wrappers."""
    while hasattr(obj, ORIGINAL_ATTR):
        obj = getattr(obj, ORIGINAL_ATTR)
    return obj


def signature_problem(patch: Patch) -> str | None:
    """None when the target exists and its parameters start with ``patch.params``."""
    try:
        fn = original(current(patch))
    except (ImportError, AttributeError, KeyError) as exc:
        return f"{patch.target} is missing ({type(exc).__name__}: {exc})"
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    try:
        names = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        return f"{patch.target}: no signature ({exc})"
    expected = patch.params
    if names[: len(expected)] != expected:
        return f"{patch.target}: parameters {names}, memest expects them to start with {expected}"
    return None


def is_patched(patch: Patch) -> bool:
    try:
        return hasattr(current(patch), ORIGINAL_ATTR)
    except (ImportError, AttributeError, KeyError):
        return False


def apply_patch(patch: Patch) -> str | None:
    """Wrap one target; returns a problem string instead of raising. Idempotent."""
    problem = signature_problem(patch)
    if problem is not None:
        return problem
    if is_patched(patch):
        return None
    holder = _holder(patch)
    orig = current(patch)
    wrapper = patch.make(orig)
    setattr(wrapper, ORIGINAL_ATTR, orig)
    setattr(wrapper, PATCH_ATTR, patch.name)
    setattr(holder, patch.attr, wrapper)
    return None


def remove_patch(patch: Patch) -> None:
    """Unpatch: put the original back (no-op when not patched)."""
    try:
        obj = current(patch)
    except (ImportError, AttributeError, KeyError):
        return
    if not hasattr(obj, ORIGINAL_ATTR):
        return
    setattr(_holder(patch), patch.attr, original(obj))


# --------------------------------------------------------------------------- import watch
class _ThenCall:
    """A module's own loader, then ``done(name)`` once the module has run (a PEP 451 loader)."""

    def __init__(self, loader: Any, done: Callable[[str], None]) -> None:
        self.loader = loader
        self.done = done

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        created: types.ModuleType | None = self.loader.create_module(spec)
        return created

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps its own loader (inspect.getsource, importlib.resources read it).
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        self.done(module.__name__)


class ImportWatch:
    """Calls ``on_import(name)`` right after each watched module is first imported.

    A ``sys.meta_path`` finder (PEP 451, without importlib.abc, whose import costs more than
    the rest of the plugin's). The call runs before the import statement that loaded the module returns, so a wrapper
    installed there is what every importer of the module sees. The watch leaves
    ``sys.meta_path`` once every watched module has loaded; ``on_import`` must not raise.
    """

    def __init__(self, on_import: Callable[[str], None]) -> None:
        self.pending: set[str] = set()
        self.on_import = on_import

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenCall(spec.loader, self._loaded)  # type: ignore[assignment]
            return spec
        return None

    def _loaded(self, name: str) -> None:
        self.pending.discard(name)
        if not self.pending:
            self.stop()
        self.on_import(name)

    def start(self, modules: set[str]) -> None:
        self.pending |= modules
        if self.pending and self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def stop(self) -> None:
        self.pending.clear()
        while self in sys.meta_path:
            sys.meta_path.remove(self)
