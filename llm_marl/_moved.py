"""Old import paths of modules that moved keep importing for one release, with a warning.

``alias_modules({"old.path": "new.path"})`` installs an import hook: ``import old.path`` (or
``from old import path``) warns with a :class:`DeprecationWarning` naming the new path and gives
the module at ``new.path`` itself — one module object under both names, so attributes set through
either are seen through both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable, Mapping


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in self.moved else None

    def create_module(self, spec: Any) -> Any:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import {new} instead (the old path will be removed)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """The module is the new one, already executed."""


def alias_modules(moved: Mapping[str, str]) -> None:
    """Make each old dotted name in ``moved`` import the module at its new name (with a warning)."""
    sys.meta_path.insert(0, _MovedModules(moved))


def forward_old_names(package: str, home: str, getattr_: Callable[[str], Any]) -> Callable[[str], Any]:
    """``__getattr__`` for a package that took the name of a module that moved into it as ``home``:
    its own names first (``getattr_``), then any other name of the old module, with a warning."""

    def forwarded(name: str) -> Any:
        try:
            return getattr_(name)
        except AttributeError:
            module = importlib.import_module(home)
            if name.startswith("__") or not hasattr(module, name):
                raise
        warnings.warn(f"{package}.{name} moved to {home}.{name}; import it from {home} (the old path will be removed)",
                      DeprecationWarning, stacklevel=2)
        return getattr(module, name)

    return forwarded
