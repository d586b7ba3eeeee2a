"""The import rules of docs/architecture.md ("Import rules"), checked on the source with ``ast``.

Every import statement counts, those inside functions too; relative imports are resolved, and
``import a.b`` and ``from a import b`` where ``b`` is a submodule both name that submodule. A
package's ``__init__`` that runs because a submodule is imported is not counted as an import.

1. No import cycle among ``jupyter_mn`` modules, printed as one loop and the imports that make
   it. Every import counts: those under ``if TYPE_CHECKING:`` (a type-only loop still makes two
   modules that cannot be read, tested or moved apart) and those inside functions (deferring an
   import hides a loop from the interpreter, not from the reader).
2. The node agent side (``node/``) and the rank side (``rank/``) import nothing of the kernel
   side: only their own package (the node side also the rank side's) and ``SHARED``: the wire
   (``wire/``) and the errors. Imports under ``if TYPE_CHECKING:`` are exempt here (and in rule
   3): they never run, so they load nothing into a node or a rank.
3. No private name (``_x``, not ``__dunder__`` nor ``_sunder_`` protocol names such as
   ``_render_traceback_``) used across modules:

   - ``from .x import _y`` (``_y`` not a submodule);
   - ``mod._y`` where ``mod`` is a ``jupyter_mn`` module imported here, or ``Name._y`` where
     ``Name`` was imported from one;
   - ``obj._y`` on any other object except ``self`` and ``cls`` (``self.other._y`` counts), when
     this module defines no ``_y`` itself (no ``def``/``class _y``, no ``_y = …``, no
     ``x._y = …``) and another ``jupyter_mn`` module does: the attribute can then only be that
     module's. A private of another library (a dask scheduler's ``_broker``) is not ours to
     judge, nor is anything reached from an import from outside ``jupyter_mn`` (``os._exit``,
     ``t = multiprocessing.resource_tracker; t._stop``).
4. Messages are types, not tagged dicts: no dict literal with an ``"op"`` key (``{"op": …}``,
   ``dict(op=…)``) and no ``x["op"]`` anywhere in ``jupyter_mn`` or the stand-in rank (the agent
   ↔ rank wire is ``rankwire.py``'s frozen dataclasses).
5. No class over ``MAX_CLASS_LINES`` lines in ``jupyter_mn`` (from ``class`` to its last line);
   no function over ``MAX_FUNCTION_LINES`` in the node and rank sides, except those in
   ``OVERLONG``, which must shrink below it and leave the list.

6. Packages import downward only, in the order ``LAYERS`` gives (docs/architecture.md): every
   import counts, type-only and function-local ones too; a package no layer names is reported.

Besides the source, what crosses processes pickled is checked: the modules that unpickling each
message imports are ones its receiving side may import (``SHARED``, and the rank or node side's
own packages).
"""

from __future__ import annotations

import ast
import pickle
import pickletools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jupyter_mn.wire.events import RankStatus

ROOT = Path(__file__).resolve().parent.parent
#: What the node and rank sides may import besides their own packages: the wire and the errors.
SHARED = ("jupyter_mn.wire", "jupyter_mn.errors")
#: The longest a class of ``jupyter_mn`` may be, in lines.
MAX_CLASS_LINES = 250
#: The longest a function of the node and rank sides may be, in lines ("about 50").
MAX_FUNCTION_LINES = 55
#: Functions known to be longer (module.function), each to be split and then removed from here.
OVERLONG = frozenset({"jupyter_mn.rank.env.rank_env", "jupyter_mn.rank.checkpoint.save"})
#: ``jupyter_mn``'s packages from the top down (a top-level module counts as one, ``""`` is the
#: package's front): each imports only its own modules and those of the layers below its own.
LAYERS = (
    ("cli", "server", "", "nccl", "checkpoint"),
    ("kernel",),
    ("jobs",),
    ("views", "doctor"),
    ("gang",),
    ("node",),
    ("rank",),
    ("model",),
    ("wire", "errors"),
)
#: Each side, and the packages it may import.
SIDES = {
    "jupyter_mn.node": ("jupyter_mn.node", "jupyter_mn.rank"),
    "jupyter_mn.rank": ("jupyter_mn.rank",),
}


@dataclass(frozen=True)
class Import:
    source: str  #: the importing module
    target: str  #: the imported module
    line: int
    type_checking: bool


def is_private(name: str) -> bool:
    """``_x`` but neither ``__x__`` nor an IPython/Python ``_x_`` protocol name."""
    return name.startswith("_") and not name.endswith("_")


def discover(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``) by dotted name."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


class ModuleScan(ast.NodeVisitor):
    """One module's imports, the names they bind, and its uses of private attributes."""

    def __init__(self, root: Path, name: str, modules: dict[str, Path]) -> None:
        self.name, self.modules = name, modules
        path = modules[name]
        self.file = path.relative_to(root).as_posix()
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.root = name.split(".")[0]
        self.imports: list[Import] = []
        #: (line, what) for each private name this module takes from another
        self.offenders: list[tuple[int, str]] = []
        #: local name → the jupyter_mn module it is, or (module, name) it was imported from;
        #: None for a name imported from outside jupyter_mn
        self.bound: dict[str, str | tuple[str, str] | None] = {}
        self.defined: set[str] = set()
        #: ``obj._y`` on objects of unknown origin: (line, ``obj``, ``_y``)
        self.unknown: list[tuple[int, str, str]] = []
        self._attributes: list[ast.Attribute] = []
        self._type_checking = False
        self.visit(ast.parse(path.read_text(), str(path)))
        for node in self._attributes:
            self._check_attribute(node)

    # ---- imports
    def _module(self, dotted: str) -> str | None:
        """The longest prefix of ``dotted`` that is one of our modules."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.modules:
                return ".".join(parts[:end])
        return None

    def _add(self, target: str | None, node: ast.stmt) -> None:
        if target is not None and target != self.name:
            self.imports.append(Import(self.name, target, node.lineno, self._type_checking))

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        outer, self._type_checking = self._type_checking, True
        for child in node.body:
            self.visit(child)
        self._type_checking = outer
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = self._module(alias.name)
            self._add(target, node)
            if alias.asname:
                self.bound[alias.asname] = target
            else:  # `import a.b` binds `a`
                top = alias.name.split(".")[0]
                self.bound[top] = top if top == self.root else None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        ours = source.split(".")[0] == self.root
        for alias in node.names:
            local = alias.asname or alias.name
            submodule = f"{source}.{alias.name}"
            if not ours:
                self.bound[local] = None
            elif submodule in self.modules:
                self._add(submodule, node)
                self.bound[local] = submodule
            else:
                self._add(self._module(source), node)
                self.bound[local] = (source, alias.name)
                if is_private(alias.name):
                    self.offenders.append(
                        (node.lineno, f"imports private {alias.name} from {source}")
                    )

    # ---- what this module defines, and the private attributes it reads
    def _define(self, target: ast.expr) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.defined.add(node.id)
            elif isinstance(node, ast.Attribute):
                self.defined.add(node.attr)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.defined.add(node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.defined.add(node.name)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._define(target)
        [target] = node.targets if len(node.targets) == 1 else [None]
        if isinstance(target, ast.Name) and self._resolve(node.value) is None:
            self.bound[target.id] = None  # reached from outside jupyter_mn
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._define(node.target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._define(node.target)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr):
            self._attributes.append(node)
        self.generic_visit(node)

    def _resolve(self, node: ast.expr) -> str | tuple[str, str] | bool | None:
        """What ``node`` names: one of our modules, a name imported from one, None (something
        from outside jupyter_mn) or False (an object of unknown origin)."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id, False)
        if isinstance(node, ast.Attribute):
            owner = self._resolve(node.value)
            if isinstance(owner, str):
                submodule = f"{owner}.{node.attr}"
                return submodule if submodule in self.modules else (owner, node.attr)
            return None if owner is None else False
        return False

    def _check_attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            return
        owner = self._resolve(value)
        if owner is None:
            return
        if isinstance(owner, str):
            what = f"module {owner}"
        elif isinstance(owner, tuple):
            what = f"{owner[1]} from {owner[0]}"
        else:
            if node.attr not in self.defined:
                self.unknown.append((node.lineno, ast.unparse(value), node.attr))
            return
        self.offenders.append((node.lineno, f"reads private {node.attr} of {what}"))


def scan(root: Path, package: str) -> list[ModuleScan]:
    modules = discover(root, package)
    return [ModuleScan(root, name, modules) for name in modules]


def strongly_connected(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                yield from visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                yield sorted(component)

    for node in sorted(graph):
        if node not in index:
            yield from visit(node)


def shortest_loop(graph: dict[str, set[str]], start: str, members: list[str]) -> list[str]:
    """The shortest import loop from ``start`` back to it inside ``members`` (breadth first)."""
    inside = set(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, set()) & inside):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    return [start]


def import_cycles(scans: list[ModuleScan]) -> list[str]:
    """One entry per cycle (strongly connected set of modules): a loop through it, then every
    import that makes it, type-only ones marked."""
    imports = [i for s in scans for i in s.imports]
    graph: dict[str, set[str]] = {}
    for i in imports:
        graph.setdefault(i.source, set()).add(i.target)
    files = {s.name: s.file for s in scans}
    report = []
    for component in strongly_connected(graph):
        lines: dict[tuple[str, str], set[str]] = {}
        for i in imports:
            if i.source in component and i.target in component:
                mark = f"{i.line} (type only)" if i.type_checking else str(i.line)
                lines.setdefault((i.source, i.target), set()).add(mark)
        edges = [
            f"    {source} → {target} ({files[source]}:{','.join(sorted(at, key=_line))})"
            for (source, target), at in sorted(lines.items())
        ]
        loop = " → ".join(shortest_loop(graph, component[0], component))
        report.append(f"cycle {loop}, among {', '.join(component)}:\n" + "\n".join(edges))
    return report


def _line(mark: str) -> int:
    return int(mark.split(" ")[0])


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def upward_imports(
    scans: list[ModuleScan], sides: dict[str, tuple[str, ...]], shared: tuple[str, ...]
) -> list[str]:
    """Imports by a side's module of anything but its allowed packages and the shared leaves."""
    found = []
    for s in scans:
        for side, allowed in sides.items():
            if not within(s.name, side):
                continue
            found += [
                f"{s.file}:{i.line}: {s.name} (the {side} side) imports {i.target}"
                for i in s.imports
                if not i.type_checking
                and not any(within(i.target, ok) for ok in (*allowed, *shared))
            ]
    return found


def layer_breaches(scans: list[ModuleScan], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Imports of a package in the same layer or above (type-only and function-local ones
    too), and modules of packages no layer names."""
    depth = {package: level for level, names in enumerate(layers) for package in names}

    def package(module: str) -> str:
        return module.partition(".")[2].partition(".")[0]

    found = []
    for s in scans:
        source = package(s.name)
        if source not in depth:
            found.append(f"{s.file}: package {source!r} is in no layer")
            continue
        found += [
            f"{s.file}:{i.line}: {s.name} ({source}) imports {i.target} ({target}), not below it"
            for i in s.imports
            if (target := package(i.target)) != source and depth.get(target, -1) <= depth[source]
        ]
    return found


def private_uses(scans: list[ModuleScan]) -> list[str]:
    """Every private name used across modules, in file order."""
    definers: dict[str, list[str]] = {}
    for s in scans:
        for name in s.defined:
            definers.setdefault(name, []).append(s.name)
    found = []
    for s in scans:
        offenders = s.offenders + [
            (line, f"reads private {attr} of {obj} (defined in {', '.join(owners)})")
            for line, obj, attr in s.unknown
            if (owners := sorted(definers.get(attr, ())))
        ]
        found += [f"{s.file}:{line}: {what}" for line, what in sorted(offenders)]
    return found


def op_dicts(root: Path, package: str) -> list[str]:
    """Every dict built or read with an ``"op"`` key: the tagged messages ``rankwire`` replaced."""
    return [line for path in discover(root, package).values() for line in op_dicts_in(root, path)]


def op_dicts_in(root: Path, path: Path) -> list[str]:
    """``op_dicts`` of one file, in line order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Dict | ast.MatchMapping) and any(_is_op(k) for k in node.keys):
            found.append((node.lineno, 'a dict with an "op" key'))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "dict"
            and any(k.arg == "op" for k in node.keywords)
        ):
            found.append((node.lineno, "dict(op=…)"))
        elif isinstance(node, ast.Subscript) and _is_op(node.slice):
            found.append((node.lineno, ast.unparse(node)))
    file = path.relative_to(root).as_posix()
    return [f"{file}:{line}: {what}" for line, what in sorted(found)]


def _is_op(node: ast.expr | None) -> bool:
    """``"op"``, as a dict's key, a subscript or a key of a ``case {"op": …}`` pattern."""
    return isinstance(node, ast.Constant) and node.value == "op"


def long_definitions(
    root: Path, package: str, kinds: tuple[type, ...], limit: int
) -> dict[str, int]:
    """``{module.name: lines}`` of the definitions of ``kinds`` (``ast.ClassDef``,
    ``ast.FunctionDef``…) longer than ``limit`` lines, methods named by their own name."""
    found = {}
    for name, path in discover(root, package).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, kinds):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found[f"{name}.{node.name}"] = lines
    return found


@pytest.fixture(scope="module")
def package() -> list[ModuleScan]:
    return scan(ROOT, "jupyter_mn")


def test_no_import_cycles_among_jupyter_mn_modules(package):
    cycles = import_cycles(package)
    assert not cycles, "\n".join(cycles)


def test_the_node_and_rank_sides_import_nothing_of_the_kernel_side(package):
    offenders = upward_imports(package, SIDES, SHARED)
    assert not offenders, "\n".join(offenders)


def test_packages_import_only_the_layers_below_their_own(package):
    offenders = layer_breaches(package, LAYERS)
    assert not offenders, "\n".join(offenders)


def pickled_modules(obj: object) -> set[str]:
    """The ``jupyter_mn`` modules that unpickling ``obj`` imports (protocol 2 names each class
    with a GLOBAL: "module name")."""
    found = {
        str(arg).split(" ")[0]
        for op, arg, _ in pickletools.genops(pickle.dumps(obj, protocol=2))
        if op.name == "GLOBAL"
    }
    return {m for m in found if m.split(".")[0] == "jupyter_mn"}


def sent_to_the_nodes() -> list[object]:
    """What the kernel pickles to node agents and ranks, built by the kernel's own code: a cell's
    payload with a captured name, and a launch with a script."""
    from jupyter_mn.gang import make_gang
    from jupyter_mn.gang.nodelaunch import launch_for
    from jupyter_mn.kernel.cell import Shipper, compile_cell
    from jupyter_mn.model.spec import ClusterSpec
    from jupyter_mn.wire.launchspec import Script
    from jupyter_mn.wire.payload import CellPayload

    names, notes = Shipper().capture(compile_cell("x + 1"), {"x": 1})
    gang = make_gang(ClusterSpec(env=(("A", "b"),)))
    gang.core.master = ("127.0.0.1", 1)
    return [
        CellPayload("x + 1", 1, names, notes=notes),
        launch_for(gang.core, gang.files, 2, 0, Script("train.py", ("--lr", "1"), b"print(1)")),
    ]


@pytest.mark.parametrize("message", sent_to_the_nodes(), ids=lambda m: type(m).__name__)
def test_what_the_kernel_pickles_to_the_nodes_is_defined_where_they_may_import(message):
    modules = pickled_modules(message)
    assert modules, "the sample names a class of ours"
    outside = sorted(m for m in modules if not any(within(m, ok) for ok in SHARED))
    assert not outside, f"the nodes would import {outside}"


def between_agent_and_rank() -> list[tuple[object, str]]:
    """Every message on a rank's control and stacks sockets, with the side that unpickles it."""
    from jupyter_mn.wire.events import DisplayOutput, PreemptCause, Preemption, RankError, RankReply
    from jupyter_mn.wire.payload import CellPayload
    from jupyter_mn.wire.rankwhere import AbortRequest, RankWhere, WhereRequest
    from jupyter_mn.wire.rankwire import (
        LeaveGroup,
        RankReady,
        Reform,
        Reformed,
        RunCell,
        StartFailed,
        Stop,
    )

    rank, node = "jupyter_mn.rank", "jupyter_mn.node"
    error = RankError.raised(ValueError("x"), ["Cell In[1], line 1"])
    return [
        (RunCell(CellPayload("x + 1", 1)), rank),
        (LeaveGroup(1), rank),
        (Reform(2, reconnect=True), rank),
        (Stop(), rank),
        (WhereRequest(True), rank),
        (AbortRequest(1), rank),
        (Preemption(0, PreemptCause.SIGNAL, 0.0), rank),
        (RankReady(0, 0, 1, "cpu", "gloo", "h"), node),
        (StartFailed("E: x"), node),
        (Reformed(0, False, "E: x"), node),
        (DisplayOutput("display", {"text/plain": "1"}), node),
        (RankReply(0, RankStatus.ERROR, 0.1, error), node),
        (RankWhere(0, 0, True, ("Cell In[1], line 1",)), node),
    ]


@pytest.mark.parametrize(
    ("message", "side"), between_agent_and_rank(), ids=lambda m: type(m).__name__
)
def test_what_the_agent_and_its_ranks_pickle_is_defined_where_the_receiver_may_import(
    message, side
):
    allowed = {*SHARED, *SIDES[side]}
    modules = pickled_modules(message)
    assert modules, "the sample names a class of ours"
    outside = sorted(m for m in modules if not any(within(m, ok) for ok in allowed))
    assert not outside, f"the {side} side would import {outside}"


def test_every_message_of_the_rank_wire_has_a_sample_above():
    import dataclasses

    import jupyter_mn.wire.rankwire as wire

    defined = {
        cls
        for cls in vars(wire).values()
        if dataclasses.is_dataclass(cls) and cls.__module__ == wire.__name__
    }
    sampled = {type(message) for message, _ in between_agent_and_rank()}
    assert defined <= sampled, f"no sample of {sorted(c.__name__ for c in defined - sampled)}"


def test_no_message_is_a_dict_tagged_with_op():
    """In the package, the stand-in rank (``rank/standin.py``) included."""
    offenders = op_dicts(ROOT, "jupyter_mn")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize(
    ("package", "kinds", "limit", "known"),
    [
        ("jupyter_mn", (ast.ClassDef,), MAX_CLASS_LINES, frozenset()),
        *(
            (side, (ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES, OVERLONG)
            for side in SIDES
        ),
    ],
    ids=["classes", "node functions", "rank functions"],
)
def test_no_definition_is_over_the_limit_but_those_known(package, kinds, limit, known):
    long = long_definitions(ROOT, package.replace(".", "/"), kinds, limit)
    new = {name: lines for name, lines in long.items() if name not in known}
    assert not new, f"over {limit} lines: {new}"
    mine = {name for name in known if within(name, package)}
    shrunk = sorted(mine - set(long))
    assert not shrunk, f"no longer over {limit} lines, drop from the known list: {shrunk}"


def test_the_op_and_class_checks_see_offenders(tmp_path):
    files = {
        "__init__.py": "",
        "a.py": 'def f(m):\n    return {"op": "run"}, dict(op="x"), m["op"], {"kind": 1}\n'
        'match 1:\n    case {"op": "stop"}:\n        pass\n',
        "b.py": "class Big:\n" + "    x = 1\n" * 5 + "class Small:\n    y = 2\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    assert op_dicts(tmp_path, "pkg") == [
        'pkg/a.py:2: a dict with an "op" key',
        "pkg/a.py:2: dict(op=…)",
        "pkg/a.py:2: m['op']",
        'pkg/a.py:4: a dict with an "op" key',
    ]
    assert long_definitions(tmp_path, "pkg", (ast.ClassDef,), 5) == {"pkg.b.Big": 6}


def test_the_pickle_check_sees_a_kernel_side_class():
    from jupyter_mn.model.spec import ClusterSpec

    assert "jupyter_mn.model.spec" in pickled_modules({"spec": ClusterSpec()})


def test_no_private_name_is_used_across_modules(package):
    offenders = private_uses(package)
    assert not offenders, "\n".join(offenders)


def test_the_checker_reports_cycles_upward_imports_and_private_names(tmp_path):
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": (
            "def f():\n    from .a import _x\n    import pkg.c as c\n    return c._hidden\n"
            "import pkg.sub.leaf\n"
        ),
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n",
        "d.py": "import os\nfrom pkg.c import C\nos._exit\nC._z\nt = os.path\nt._x\n",
        "e.py": (
            "class E:\n    _other = 1\n"
            "    def f(self, o):\n        self._own = o._own\n        return o._dask, o._x\n"
        ),
        "f.py": "def f(o):\n    return o._other, o._dask\n",
        "sub/__init__.py": "",
        "sub/leaf.py": "from .. import a\nfrom ..e import E\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    scans = scan(tmp_path, "pkg")
    assert import_cycles(scans) == [
        "cycle pkg.c → pkg.d → pkg.c, among pkg.c, pkg.d:\n"
        "    pkg.c → pkg.d (pkg/c.py:3 (type only))\n"
        "    pkg.d → pkg.c (pkg/d.py:2)",
        "cycle pkg.a → pkg.b → pkg.a, among pkg.a, pkg.b, pkg.sub.leaf:\n"
        "    pkg.a → pkg.b (pkg/a.py:1)\n"
        "    pkg.b → pkg.a (pkg/b.py:2)\n"
        "    pkg.b → pkg.sub.leaf (pkg/b.py:5)\n"
        "    pkg.sub.leaf → pkg.a (pkg/sub/leaf.py:1)",
    ]
    assert upward_imports(scans, {"pkg.sub": ("pkg.sub",)}, ("pkg.e",)) == [
        "pkg/sub/leaf.py:1: pkg.sub.leaf (the pkg.sub side) imports pkg.a"
    ]
    assert layer_breaches(scans, (("", "a"), ("b",), ("sub",), ("c", "d"), ("e",))) == [
        "pkg/b.py:2: pkg.b (b) imports pkg.a (a), not below it",
        "pkg/c.py:3: pkg.c (c) imports pkg.d (d), not below it",
        "pkg/d.py:2: pkg.d (d) imports pkg.c (c), not below it",
        "pkg/f.py: package 'f' is in no layer",
        "pkg/sub/leaf.py:1: pkg.sub.leaf (sub) imports pkg.a (a), not below it",
    ]
    assert private_uses(scans) == [
        "pkg/b.py:2: imports private _x from pkg.a",
        "pkg/b.py:4: reads private _hidden of module pkg.c",
        "pkg/d.py:4: reads private _z of C from pkg.c",
        "pkg/f.py:2: reads private _other of o (defined in pkg.e)",
    ]
