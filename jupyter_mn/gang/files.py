"""The notebook's working directory on every node of a gang: seen where shared, else copied.

Before the ranks start, each node says whether it sees the kernel's directory itself (same
path, same files: ``manifest.stamp``); those nodes run the ranks there and are sent nothing. The
others get a copy (``node/files.py``), brought up to date before every cell: only files whose
content changed are named, and only contents a node does not hold are sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..manifest import FileEntry, FileUpdate, changes
from ..workdir import SMALL_FILE, Digests, Selection, size_text

if TYPE_CHECKING:
    from .base import Gang

#: Seconds a node may take to say whether it sees the directory, and to store an update.
_ASK_S = 60.0


class FileSync:
    """Which nodes of a gang need the directory sent, and what they hold of it."""

    def __init__(self, gang: Gang) -> None:
        self.gang = gang
        self.root: str | None = None
        #: the nodes that get a copy (they do not see the kernel's directory)
        self.copies: list[int] = []
        #: what the copies hold, by path
        self.held: dict[str, FileEntry] = {}
        #: bytes of content sent so far, per node
        self.moved: dict[int, int] = {}
        self._digests = Digests()

    def decide(self, selection: Selection | None, local: bool) -> None:
        """Ask every node whether it sees ``selection``'s directory (on the local backend they
        are this machine: they do); None: the directory does not travel."""
        if selection is None:
            return
        self.root = selection.root
        if local:
            return
        paths = [f.path for f in selection.files]
        asked = [a.sees_files(selection.root, paths, selection.stamp) for a in self.gang.agents]
        self.copies = [n for n, seen in enumerate(asked) if not seen.result(timeout=_ASK_S)]

    def launch_options(self, node: int) -> dict[str, Any]:
        """Where node ``node``'s ranks run: its copy, the directory itself, or (the directory
        does not travel) where the backend says."""
        if node in self.copies:
            return {"files": True}
        return {} if self.root is None else {"cwd": self.root}

    def sync(self, selection: Selection) -> list[str]:
        """Bring every copy up to ``selection``; the notes for the cell (what moved)."""
        if not self.copies:
            return []
        wanted = self._digests.entries(selection)
        placed, removed = changes(self.held, wanted)
        if not placed and not removed:
            return []
        digests = sorted({e.digest for e in placed})
        agents = self.gang.agents
        lacking = {n: agents[n].missing_files(digests) for n in self.copies}
        lacking = {n: set(f.result(timeout=_ASK_S)) for n, f in lacking.items()}
        blobs = {
            e.digest: self._digests.blob(selection.root, e)
            for e in placed
            if any(e.digest in lack for lack in lacking.values())
        }
        sent = {n: {d: blobs[d] for d in lack} for n, lack in lacking.items()}
        updates = {
            n: agents[n].update_files(FileUpdate(placed, removed, sent[n])) for n in self.copies
        }
        for future in updates.values():
            future.result(timeout=_ASK_S)
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
        return notes

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
