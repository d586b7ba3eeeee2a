"""Turn a notebook cell into a ``CellPayload`` the ranks can run, or say exactly why not.

Everything here runs in the kernel before anything is launched: the cell is compiled (IPython
syntax included) so a ``SyntaxError`` shows the cell's own line numbers, the notebook names it reads
are found with ``symtable`` (an ``ast`` walk gets scopes wrong), and each one is cloudpickled on
its own so one error can list every variable that cannot be sent.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import hashlib
import io
import os
import pickle
import re
import symtable
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import CodeType, FunctionType, ModuleType
from typing import Any

import cloudpickle
from IPython.core.inputtransformer2 import TransformerManager

from ..errors import CaptureError, SpecError
from ..model.credentials import holds_secret
from ..wire.payload import Captured
from ..wire.values import CpuPickler

#: Names every rank defines itself; never shipped from the notebook.
RANK_NAMES = frozenset({"torch", "dist", "cluster_info"})
_IPYTHON_NAMES = frozenset({"get_ipython", "In", "Out", "exit", "quit", "display"})
_IPYTHON_HIDDEN = re.compile(r"^_(i{1,3}|ii|iii|oh|ih|dh|\d+|i\d+)?$|^__{1,2}$")
#: Payloads at least this large are sent once and referenced by digest afterwards.
CACHE_MIN_BYTES = 1 << 20
#: A large value's digest is taken in pieces this large, on every core.
_PIECE = 8 << 20
_MAGIC_CALLS = ("run_line_magic", "run_cell_magic")
_transformer = TransformerManager()


def compile_cell(source: str) -> str:
    """IPython-transform and compile the cell; return the Python source the ranks will run."""
    if not source.strip():
        raise SpecError("the cell is empty: there is nothing to run on the ranks")
    try:
        return _compiled(source)
    except SyntaxError as exc:
        line = exc.lineno or 0
        text = (exc.text or "").rstrip("\n")
        caret = " " * max((exc.offset or 1) - 1, 0) + "^"
        detail = f"\n    {text}\n    {caret}" if text else ""
        raise SpecError(f"SyntaxError in the cell, line {line}: {exc.msg}{detail}") from None


#: How many cells' analyses are remembered: a notebook re-runs the same cells, and transforming,
#: compiling and reading the symbol tables of a cell costs ~0.3 ms each time (a failure is not
#: remembered).
_CELLS_KEPT = 256


@functools.lru_cache(maxsize=_CELLS_KEPT)
def _compiled(source: str) -> str:
    python = _transformer.transform_cell(source)
    compile(python, "<cell>", "exec", dont_inherit=True)  # a SyntaxError says where
    return python


@functools.lru_cache(maxsize=_CELLS_KEPT)
def free_names(python: str) -> frozenset[str]:
    """Names the cell reads but never binds, including reads in nested scopes."""
    top, nested = _tables(python)
    bound = _bound(top, nested)
    names = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    names |= {
        s.get_name() for t in nested for s in t.get_symbols() if s.is_global() and s.is_referenced()
    }
    names -= bound
    for snippet in _magic_arguments(python):
        try:
            names |= free_names(_transformer.transform_cell(snippet))
        except SyntaxError:
            continue
    return frozenset(names)


@functools.lru_cache(maxsize=_CELLS_KEPT)
def bound_names(python: str) -> frozenset[str]:
    """Names the cell binds in its namespace: after it runs they are rank-local state."""
    return frozenset(_bound(*_tables(python)))


def _tables(python: str) -> tuple[symtable.SymbolTable, list[symtable.SymbolTable]]:
    top = symtable.symtable(python, "<cell>", "exec")
    nested, stack = [], list(top.get_children())
    while stack:
        table = stack.pop()
        nested.append(table)
        stack.extend(table.get_children())
    return top, nested


def _bound(top: symtable.SymbolTable, nested: list[symtable.SymbolTable]) -> set[str]:
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    return bound | {
        s.get_name()
        for t in nested
        for s in t.get_symbols()
        if s.is_declared_global() and s.is_assigned()
    }


def _magic_arguments(python: str) -> Iterable[str]:
    """Code given to ``%time``-style magics, which the transformer turns into string arguments."""
    for node in ast.walk(ast.parse(python)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MAGIC_CALLS
            and len(node.args) >= 2
        ):
            arg = node.args[-1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value


class Shipper:
    """Pickles the notebook names a cell reads; remembers large ones the ranks already hold."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}

    def forget(self) -> None:
        """The ranks were (re)started and hold nothing."""
        self._held.clear()

    def capture(
        self,
        python: str,
        namespace: Mapping[str, Any],
        *,
        rank_defined: Iterable[str] = (),
        push: Iterable[str] = (),
    ) -> tuple[tuple[Captured, ...], tuple[str, ...]]:
        """Pickle each name the cell reads from ``namespace``; raise one error for all failures.

        Names the gang's own cells defined stay rank-local (they win over a notebook variable of
        the same name), unless named in ``push``. Returns the captured names, each with its
        bytes (``for_ranks`` leaves out those the ranks hold), and notes to show.
        """
        push = set(push)
        missing = sorted(n for n in push if n not in namespace)
        if missing:
            raise SpecError(f"--push names not defined in the notebook: {', '.join(missing)}")
        wanted = (free_names(python) - set(rank_defined)) | push
        notes: list[str] = []
        picked: dict[str, Any] = {}
        for name in sorted(wanted):
            if name not in namespace or _never_shipped(name, namespace[name], push):
                continue
            value = namespace[name]
            if name not in push and holds_secret(name, value):
                what = "looks like" if isinstance(value, (str, bytes, bytearray)) else "holds"
                notes.append(
                    f"not sending {name!r}: it {what} a credential (use --push {name} to send it)"
                )
                continue
            hidden = sorted(_secrets_read_by(value) - push)
            if hidden:
                notes.append(
                    f"not sending {name!r}: it reads {', '.join(hidden)}, which looks like a "
                    f"credential (use --push {','.join(hidden)} to send it along)"
                )
                continue
            picked[name] = value
        captured, problems = [], []
        for name, value in picked.items():
            buffers: list[pickle.PickleBuffer] = []
            try:  # an array's or a tensor's memory out of band: never copied into the pickle
                out = io.BytesIO()
                CpuPickler(out, protocol=5, buffer_callback=buffers.append).dump(value)
                data = out.getvalue()
            except Exception as exc:
                problems.append(_describe_failure(name, value, exc))
                continue
            captured.append(Captured(name, "", data, tuple(buffers)))  # digest: ``for_ranks``
        if problems:
            raise CaptureError(
                "%%cluster cannot send these notebook variables to the ranks:\n"
                + "\n".join(f"  - {p}" for p in problems)
                + "\nDefine them inside the cell, or make them picklable."
            )
        return tuple(captured), tuple(notes)

    def for_ranks(self, captured: tuple[Captured, ...], cache: bool = True) -> tuple[Captured, ...]:
        """``captured`` as the ranks get it: a large value they already hold as only its digest
        (``forget`` first when the ranks are new). Without ``cache`` (every rank on this host)
        a large value goes every time: writing it into the file they map is one memcpy, its
        digest costs several."""
        return tuple(self._reference(c, cache) for c in captured)

    def _reference(self, c: Captured, cache: bool) -> Captured:
        if c.data is None or c.nbytes < CACHE_MIN_BYTES:
            return c
        if not cache:
            self._held.pop(c.name, None)
            return c
        c = dataclasses.replace(c, digest=_digest([memoryview(c.data), *map(_raw, c.buffers)]))
        if self._held.get(c.name) == c.digest:
            return dataclasses.replace(c, data=None, buffers=())
        self._held[c.name] = c.digest
        return c


def _raw(buffer: pickle.PickleBuffer) -> memoryview:
    return buffer.raw()


def _digest(views: list[memoryview]) -> str:
    """A digest of ``views``' bytes: a large value's is taken a ``_PIECE`` at a time on every
    core (hashing releases the GIL), then of the pieces' digests (256 MiB in one thread: ~0.4 s
    on this 2-core machine idle, over 1 s loaded)."""
    pieces = [v[at : at + _PIECE] for v in views for at in range(0, v.nbytes, _PIECE)]
    if len(pieces) <= 1:
        return hashlib.blake2b(pieces[0] if pieces else b"", digest_size=16).hexdigest()
    with ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1)) as pool:
        digests = pool.map(lambda piece: hashlib.blake2b(piece, digest_size=16).digest(), pieces)
        return hashlib.blake2b(b"".join(digests), digest_size=16).hexdigest()


def _never_shipped(name: str, value: Any, push: set[str]) -> bool:
    if name in push:
        return False
    if name in RANK_NAMES or name in _IPYTHON_NAMES or _IPYTHON_HIDDEN.match(name):
        return True
    if hasattr(builtins, name) and value is getattr(builtins, name):
        return True
    return isinstance(value, ModuleType) and value.__name__ == "__main__"


def _secrets_read_by(value: Any) -> set[str]:
    """Credential-looking globals that cloudpickle would send along with ``value``.

    A notebook function (or class, or an instance of one) goes by value, with the globals its code
    reads, and so do the notebook functions and classes those are. Best effort: a credential
    held inside an object, or read through ``globals()``, is not seen.
    """
    found: set[str] = set()
    seen: set[int] = set()
    todo = [value] if isinstance(value, (FunctionType, type)) else [value, type(value)]
    while todo:
        item = todo.pop()
        if id(item) in seen or not _by_value(item):
            continue
        seen.add(id(item))
        if isinstance(item, type):
            todo += [*item.__bases__, *_functions_of(item)]
            continue
        for name in _code_names(item.__code__) & item.__globals__.keys():
            read = item.__globals__[name]
            if holds_secret(name, read):
                found.add(name)
            elif isinstance(read, (FunctionType, type)):
                todo.append(read)
    return found


def _by_value(item: Any) -> bool:
    """cloudpickle's rule: what cannot be imported by name (the notebook's code) is copied."""
    if not isinstance(item, (FunctionType, type)):
        return False
    module = sys.modules.get(getattr(item, "__module__", None) or "")
    if module is None or module.__name__ == "__main__":
        return True
    found: Any = module
    for part in item.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is not item


def _functions_of(cls: type) -> list[Any]:
    found = []
    for attr in vars(cls).values():
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if isinstance(attr, property):
            found += [f for f in (attr.fget, attr.fset, attr.fdel) if f is not None]
        elif isinstance(attr, (FunctionType, type)):
            found.append(attr)
    return found


def _code_names(code: CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _code_names(const)
    return names


def _describe_failure(name: str, value: Any, exc: Exception) -> str:
    text = f"{name!r} of type {type(value).__name__}: {type(exc).__name__}: {exc}"
    part = _offending_part(name, value)
    if part and part[0] != name:
        text += f" (offending part: {part[0]} of type {part[1]})"
    return text


def _offending_part(path: str, value: Any, depth: int = 0) -> tuple[str, str] | None:
    """Descend into containers and attributes to the innermost piece that will not pickle."""
    if depth > 4:
        return None
    for child_path, child in _children(path, value):
        try:
            cloudpickle.dumps(child)
        except Exception:
            return _offending_part(child_path, child, depth + 1) or (
                child_path,
                type(child).__name__,
            )
    return None


def _children(path: str, value: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in list(value.items())[:200]:
            yield f"{path}[{key!r}]", item
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(list(value)[:200]):
            yield f"{path}[{i}]", item
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for key, item in list(vars(value).items())[:200]:
            yield f"{path}.{key}", item
