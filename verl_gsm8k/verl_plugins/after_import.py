"""Run a function right after a module is imported, in the processes that import it."""

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, action: Callable[[types.ModuleType], None]) -> None:
        self.name, self.action = name, action

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, action = spec.loader.exec_module, self.action

        def exec_then_act(module: types.ModuleType) -> None:
            exec_module(module)
            action(module)

        spec.loader.exec_module = exec_then_act  # type: ignore[method-assign]
        return spec


def after_import(name: str, action: Callable[[types.ModuleType], None]) -> None:
    """``action(module)`` once ``name`` is imported: now if it already is, else right after."""
    if name in sys.modules:
        action(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, action))
