"""Modules of the notebook's directory, reloaded on a rank when their file changed.

After the user edits ``model.py`` beside the notebook, the next cell must run the new code on
every rank, though the ranks imported the old one. Before each cell, a rank reloads the modules
under its working directory (the notebook's directory, or its copy) whose file changed since
they were loaded, with IPython's ``%autoreload`` machinery: objects made from the old classes
and functions (a ``Net`` built before the edit) get the new code too.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import ModuleType
from typing import Any

from IPython.extensions.autoreload import superreload


def _installed() -> tuple[str, ...]:
    """Where installed code lives (never the notebook's own, even below the directory), and
    jupyter_mn itself (a checkout below the directory: the rank's own code is never reloaded,
    nor looked at every cell)."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    found |= {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(__file__))}
    return tuple(os.path.join(os.path.realpath(p), "") for p in found)


class Reloader:
    """The modules this rank loaded from ``root``, and their files' times when loaded."""

    def __init__(self, root: str) -> None:
        self.root = os.path.join(os.path.realpath(root), "")
        #: the root as given too: a module's ``__file__`` is a path below it, unresolved
        self._prefixes = (self.root, os.path.join(os.path.abspath(root), ""))
        self._installed = _installed()
        #: module name → (its file, the file's mtime when it was loaded)
        self._loaded: dict[str, tuple[str, int]] = {}
        #: the names in ``sys.modules`` looked at already (each once: a look resolves a path)
        self._seen: set[str] = set()
        #: what superreload keeps to update old objects on later reloads too
        self._old_objects: dict[Any, Any] = {}

    def _ours(self, module: ModuleType) -> str | None:
        # from its namespace: a module's __getattr__ (lazy imports, as torch's) is never run
        file = getattr(module, "__dict__", {}).get("__file__")
        if not isinstance(file, str) or not file.endswith(".py"):
            return None
        if not file.startswith(self._prefixes):
            return None
        file = os.path.realpath(file)
        if not file.startswith(self.root) or file.startswith(self._installed):
            return None
        return file

    def remember(self) -> None:
        """Note the modules imported from ``root`` since the last look (at the start, then after
        each cell, before its reply; only names not looked at before are, each once)."""
        if len(sys.modules) == len(self._seen):
            return
        for name, module in list(sys.modules.items()):
            if name in self._seen:
                continue
            self._seen.add(name)
            file = None if module is None else self._ours(module)
            if file is not None:
                self._loaded[name] = (file, _mtime(file))

    def reload(self) -> list[str]:
        """Reload the modules whose file changed (before a cell); their names. A module that no
        longer imports raises here, so the cell fails with its error."""
        done = []
        for name, (file, loaded) in list(self._loaded.items()):
            module = sys.modules.get(name)
            now = _mtime(file)
            if module is None or now < 0:  # removed from sys.modules, or its file deleted
                del self._loaded[name]
                self._seen.discard(name)  # looked at again if imported again
                continue
            if now != loaded:
                self._loaded[name] = (file, now)  # a failed reload is not retried until edited
                superreload(module, old_objects=self._old_objects)
                done.append(name)
        return done


def _mtime(file: str) -> int:
    try:
        return os.stat(file).st_mtime_ns
    except OSError:
        return -1


def reloaded_note(names: list[str]) -> str:
    """What the cell says about the modules it reloaded."""
    return f"reloaded {', '.join(sorted(names))}: changed since the last cell"
