"""The notebook's working directory on every node of a gang: seen where shared, else copied.

Before the ranks start, each node says whether it sees the kernel's directory itself (same
path, same files: ``manifest.stamp``); those nodes run the ranks there and are sent nothing. The
others get a copy (``node/files.py``), brought up to date before every cell: only files whose
content changed are named, and only contents a node does not hold are sent.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import FilesNotSent
from ..model.spec import ClusterSpec
from ..model.workdir import SMALL_FILE, Digests, Selection, for_spec
from ..wire.manifest import FileEntry, FileUpdate, changes
from ..wire.sizes import size_text
from .core import GangCore

#: Seconds a node may take to say whether it sees the directory, and to store an update.
_ASK_S = 60.0


class FileSync:
    """Which nodes of a gang need the directory sent, and what they hold of it."""

    def __init__(self, core: GangCore) -> None:
        self._core = core
        self.root: str | None = None
        #: the nodes that get a copy (they do not see the kernel's directory)
        self.copies: list[int] = []
        #: what the copies hold, by path
        self.held: dict[str, FileEntry] = {}
        #: bytes of content sent so far, per node
        self.moved: dict[int, int] = {}
        self._digests = Digests()

    def decide(self, selection: Selection | None, local: bool) -> None:
        """Ask every node whether it sees ``selection``'s directory; None: the directory does
        not travel. Local nodes are this machine: they see it, and without ``--workdir`` their
        ranks run where the backend says (the kernel's working directory, also for a script
        started after a ``%cd``)."""
        if selection is None or (local and not self._core.spec.workdir):
            return
        self.root = selection.root
        if local:
            return
        paths = [f.path for f in selection.files]
        agents = self._core.nodes.agents
        asked = [a.sees_files(selection.root, paths, selection.stamp) for a in agents]
        self.copies = [n for n, seen in enumerate(asked) if not seen.result(timeout=_ASK_S)]

    def launch_options(self, node: int) -> dict[str, Any]:
        """Where node ``node``'s ranks run: its copy, or as on the nodes that see it."""
        return {"files": True} if node in self.copies else self.shared_options()

    def shared_options(self) -> dict[str, Any]:
        """Where the ranks of the nodes that see the directory run: there (nothing: where the
        backend says)."""
        return {} if self.root is None else {"cwd": self.root}

    def relative(self, path: str) -> str | None:
        """``path`` as the copies hold it (relative to their folder), if they do."""
        if self.root is None or not self.copies:
            return None
        inside = os.path.relpath(os.path.abspath(path), self.root)
        return inside if inside in self.held else None

    def holds_package(self, name: str) -> bool:
        """Whether the copies hold the top-level module or package ``name``."""
        return any(p == f"{name}.py" or p.startswith(f"{name}/") for p in self.held)

    def refresh(self, spec: ClusterSpec) -> tuple[str, ...]:
        """Bring the copies up to date with the directory now (before each cell or script);
        the notes for it. Nothing is listed where no node has a copy."""
        if not self.copies:
            return ()
        selection = for_spec(spec)
        return () if selection is None else tuple(self._sync(selection))

    def _sync(self, selection: Selection) -> list[str]:
        """Bring every copy up to ``selection``; the notes for the cell (what moved)."""
        wanted = self._digests.entries(selection)
        placed, removed = changes(self.held, wanted)
        if not placed and not removed:
            return []
        digests = sorted({e.digest for e in placed})
        lacking = self._ask(lambda agent, n: agent.missing_files(digests))
        blobs = {
            e.digest: self._digests.blob(selection.root, e)
            for e in placed
            if any(e.digest in lack for lack in lacking.values())
        }
        sent = {n: {d: blobs[d] for d in lack} for n, lack in lacking.items()}
        self._ask(lambda agent, n: agent.update_files(FileUpdate(placed, removed, sent[n])))
        for n, contents in sent.items():
            self.moved[n] = self.moved.get(n, 0) + sum(len(b) for b in contents.values())
        first = not self.held
        self.held = wanted
        notes = [self._note(placed, removed, sent, first)]
        if first and selection.skipped:
            large = ", ".join(f"{f.path} ({size_text(f.size)})" for f in selection.skipped[:5])
            notes.append(
                f"files over {size_text(SMALL_FILE)} that are not Python sources stay behind "
                f"(put them on storage the nodes share): {large}"
            )
        if first and selection.withheld:
            named = "; ".join(f"{path} ({why})" for path, why in selection.withheld[:10])
            notes.append(f"files left behind: {named}")
        return notes

    def _ask(self, call: Callable[[Any, int], Any]) -> dict[int, Any]:
        """``call(agent, node)`` on every copy node at once; their answers. A node that fails
        has a copy in an unknown state: the gang is torn down (``FilesNotSent``)."""
        agents, asked, answers = self._core.nodes.agents, {}, {}
        node = self.copies[0]
        try:
            for node in self.copies:
                asked[node] = call(agents[node], node)
            for node, future in asked.items():
                answers[node] = future.result(timeout=_ASK_S)
            return answers
        except Exception as exc:
            why = f"node {node}: its copy of {self.root} was not updated"
            self._core.close(broken=why, wait=False)
            raise FilesNotSent(
                f"{why} ({type(exc).__name__}: {exc}); the gang was torn down"
            ) from None

    def _note(
        self,
        placed: tuple[FileEntry, ...],
        removed: tuple[str, ...],
        sent: dict[int, dict[str, bytes]],
        first: bool,
    ) -> str:
        nodes = ", ".join(map(str, self.copies))
        what = (
            f"{self.root} ({len(placed)} files)"
            if first
            else ", ".join([*(e.path for e in placed), *(f"{p} (removed)" for p in removed)])
        )
        moved = sorted({sum(len(b) for b in c.values()) for c in sent.values()})
        size = " or ".join(size_text(m) for m in moved)
        return f"files: {what} → node(s) {nodes}, which do not see it: {size} sent"
