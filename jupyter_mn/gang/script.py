"""``%cluster run SCRIPT [ARGS…]``: an unchanged training script on every rank of a gang's nodes.

Like torchrun: every rank runs ``python -u SCRIPT ARGS`` (``-m``: ``python -u -m MODULE ARGS``)
with the env contract, on a fresh
rendezvous port (rank 0 of a warm gang already hosts a TCPStore on MASTER_PORT); output streams
live like a cell's; the first rank to fail stops all of them, and the result names it with its
traceback. The value is rank 0's exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from ..errors import SpecError
from ..model.result import LOST, CellResult
from ..node.workerfuncs import find_script, has_package
from ..wire.events import OnEvent, RankState, RunStarted
from ..wire.launchspec import Script
from .base import Gang
from .core import GangCore
from .files import FileSync
from .job import INTERRUPTED_BY_USER, Job
from .nodelaunch import launch_for, ranks_cwd
from .run import rank_outcomes

#: The largest script sent to nodes that do not have it (bytes).
COPY_LIMIT = 16 << 20


def locate(core: GangCore, files: FileSync, script: str) -> tuple[list[str | None], bytes | None]:
    """The script's path as each node sees it, or None where the node lacks it and it is sent
    (with its bytes, the second item); raise before anything starts if it cannot be.

    Tried in order: the path as the kernel resolves it (a shared filesystem), then the path
    as given, relative to the ranks' working directory on each node, then the node's copy of
    the notebook's directory (``gang/files.py``). A node without it gets the kernel's copy of
    the script alone.
    """
    here = os.path.isfile(script)
    tried = [os.path.abspath(script)] if here else []
    if script not in tried:
        tried.append(script)
    cwd, addresses = ranks_cwd(core, files), core.addresses
    found = core.nodes.client.run(find_script, tried, cwd, workers=addresses, on_error="return")
    paths = [p if isinstance(p := found.get(a), str) else None for a in addresses]
    copied = files.relative(script) if here else None
    for node in files.copies:
        paths[node] = paths[node] or copied  # relative: the ranks run in the copy
    missing = _lacking(paths)
    if not missing:
        return paths, None
    if not here:
        raise SpecError(
            f"{script}: no such file on node(s) {missing} (looked for {' and '.join(tried)}); "
            "copy it there or use a filesystem the nodes share"
        )
    size = os.path.getsize(script)
    if size > COPY_LIMIT:
        raise SpecError(
            f"{script}: not on node(s) {missing}, and at {size / 2**20:.1f} MiB too large to "
            f"send (limit {COPY_LIMIT >> 20} MiB); put it on a filesystem the nodes share"
        )
    with open(script, "rb") as f:
        return paths, f.read()


def check_module(core: GangCore, files: FileSync, module: str) -> None:
    """Raise before anything starts unless ``module`` is a dotted name whose package every node
    has (a missing submodule shows as the ranks' own ``No module named`` error)."""
    if module.endswith(".py"):
        raise SpecError(f"-m {module}: give the module's name (-m {module[:-3]}), not a file")
    if not all(part.isidentifier() for part in module.split(".")):
        raise SpecError(f"-m {module}: not a module name (e.g. -m package.train)")
    found = core.nodes.client.run(
        has_package, module, ranks_cwd(core, files), workers=core.addresses, on_error="return"
    )
    top = module.partition(".")[0]
    copied = files.holds_package(top)
    missing = [
        str(n)
        for n, a in enumerate(core.addresses)
        if found.get(a) is not True and not (copied and n in files.copies)
    ]
    if missing:
        raise SpecError(
            f"-m {module}: no package {top!r} on node(s) {', '.join(missing)}; install it there "
            "or run from a directory that holds it"
        )


def _lacking(paths: list[str | None]) -> str:
    """The nodes without the script, as "1, 3"."""
    return ", ".join(str(node) for node, path in enumerate(paths) if path is None)


class ScriptJob(Job[CellResult]):
    """The script on every rank of the nodes; a failure, timeout or request stops them all."""

    def __init__(
        self,
        core: GangCore,
        files: FileSync,
        script: str,
        args: Sequence[str],
        on_event: OnEvent | None,
        module: bool = False,
    ) -> None:
        """``files``: the notebook's directory on the nodes, where the script may be."""
        super().__init__(core, on_event)
        self.files = files
        self.script = script
        self.module = module
        self.notes = files.refresh(core.spec)  # the node's copies, as a cell's are
        if module:
            check_module(core, files, script)
            self.paths, self.source = [], None
        else:
            self.paths, self.source = locate(core, files, script)
        self.args = list(args)
        self.started = time.monotonic()
        self.stopped = False

    def what(self) -> RunStarted:
        return RunStarted(self.run_id, f"%cluster run {' '.join([self.script, *self.args])}")

    def start(self) -> None:
        core = self.core
        _, port = core.nodes.agents[0].endpoint().result()  # a fresh store: rank 0 keeps its own
        self.started = time.monotonic()
        sent = [
            launch_for(core, self.files, port, n, self._script(n)) for n in range(core.nodes.count)
        ]
        core.nodes.call_each(lambda node, agent: agent.run_script(sent[node]))

    def _script(self, node: int) -> Script:
        """What node ``node`` runs: the module, its own copy of the script, or the kernel's."""
        args = tuple(self.args)
        if self.module:
            return Script(self.script, args, module=True)
        path = self.paths[node]
        if path:
            return Script(path, args)
        return Script(os.path.basename(self.script), args, self.source)

    def take(self, item: Any) -> bool:
        # a script's ranks report their failures outside any cell run (run 0)
        if isinstance(item, RankState) and item.primary and item.run == 0:
            self.core.hub.consume(item, self.on_event)
            return True
        return super().take(item)

    def stop(self, reason: str, by_user: bool, again: bool = False) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.reason = reason if by_user else ""
        signum = signal.SIGINT if reason == INTERRUPTED_BY_USER else signal.SIGTERM
        for agent in self.core.nodes.agents:
            with contextlib.suppress(Exception):  # a lost agent's reply says so
                agent.stop_script(signum, reason)

    def settle(self) -> None:
        self.drain_logs()
        outcomes, raw = rank_outcomes(self.core.spec, self.replies)
        result = CellResult(ranks=outcomes, elapsed=time.monotonic() - self.started)
        result.value = raw[0].exit_code if 0 in raw else None
        result.notes += self.notes
        if self.source is not None:
            result.notes.append(
                f"{os.path.basename(self.script)} was sent to node(s) {_lacking(self.paths)}, "
                "which do not have it (files it imports were not)"
            )
        if self.reason:
            result.notes.append(f"the script was stopped: {self.reason}")
        lost = [o for o in outcomes if o.status == LOST and o.error and o.error.node_lost]
        if lost:
            self.core.close(broken=f"{lost[0].label} was lost")
            result.notes.append("a node was lost, so the gang was torn down")
        self.result = result

    def finish(self) -> CellResult:
        return self.result


def run_script(
    gang: Gang,
    script: str,
    args: Sequence[str],
    on_event: OnEvent | None,
    timeout: float | None = None,
    *,
    module: bool = False,
) -> CellResult:
    """Run ``script`` on every rank (``module``: ``python -m script``, as torchrun's ``-m``); the
    first failure stops the rest (failures as values)."""
    return gang.run(ScriptJob(gang.core, gang.files, script, args, on_event, module), timeout)
