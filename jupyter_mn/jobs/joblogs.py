"""Per-node log files of a job: every line its ranks wrote, rotated, readable while written.

One file per node (``logs/<job>/node-<N>.log``, rotated to ``node-<N>.log.1`` past ``MAX_BYTES``,
so a chatty job keeps at most twice that per node). Each line is
``seq<TAB>time<TAB>rank<TAB>stream<TAB>text``; ``seq`` grows per node across rotations, so a reader
that follows (the sidebar's follow mode, ``jupyter mn logs -f``) asks for lines after a cursor and
reads files backwards from their end, never whole. Where a cell, script or command starts, and
where a cell hangs or ends without finishing its work (``kernel/recorder.py``), every node's file
gets a mark (rank ``MARK_RANK``), which readers keep whatever rank they filter on and show once
however many nodes they merge.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..wire.events import LogLines
from .registry import open_private, private_dir

log = logging.getLogger(__name__)

MAX_BYTES = 8 * 2**20
_BLOCK = 1 << 16
_NODE_FILE = re.compile(r"^node-(\d+)\.log$")
#: The rank of a line that marks where a job (a cell, a script, a command) starts.
MARK_RANK = -1
#: The rank of a line a submitted run's kernel printed (its cells' outputs), shown as it is.
OUTPUT_RANK = -2
#: The stream of a failed cell's root-cause traceback (``kernel/recorder.py``): the one stream
#: shown as an error; a rank's stderr ("err") holds progress bars and warnings as well.
ERROR_STREAM = "error"


@dataclass(frozen=True)
class LogLine:
    node: int
    seq: int
    time: float
    rank: int
    stream: str
    text: str

    @property
    def is_mark(self) -> bool:
        return self.rank == MARK_RANK

    @property
    def labelled(self) -> str:
        if self.is_mark:
            return f"──── {self.text} ────"
        if self.rank == OUTPUT_RANK:
            return self.text
        return f"[node {self.node} rank {self.rank}] {self.text}"


class _NodeFile:
    """One node's file, written unbuffered in whole batches: a write that fails (disk full)
    is cut off again, so the file never holds half a line and the next batch starts clean."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.seq = 0
        self._fd, self._size = self._open()

    def _open(self) -> tuple[int, int]:
        fd = open_private(self.path)
        return fd, os.fstat(fd).st_size

    def write(self, rank: int, stream: str, lines: tuple[str, ...], now: float) -> None:
        head = f"\t{now:.3f}\t{rank}\t{stream}\t"
        first = self.seq + 1
        data = "".join(f"{first + i}{head}{text}\n" for i, text in enumerate(lines))
        batch = data.encode(errors="replace")
        if self._size + len(batch) <= self.max_bytes:  # the usual case: no rotation inside
            self.seq += len(lines)
            self._append(batch)
            return
        self._write_rotating(rank, stream, lines, now)

    def _write_rotating(self, rank: int, stream: str, lines: tuple[str, ...], now: float) -> None:
        """Line by line, rotating where the next line would not fit."""
        batch = bytearray()
        for text in lines:
            self.seq += 1
            record = f"{self.seq}\t{now:.3f}\t{rank}\t{stream}\t{text}\n".encode(errors="replace")
            if self._size + len(batch) and self._size + len(batch) + len(record) > self.max_bytes:
                self._append(bytes(batch))
                batch.clear()
                os.close(self._fd)
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._fd, self._size = self._open()
            batch += record
        self._append(bytes(batch))

    def _append(self, data: bytes) -> None:
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def close(self) -> None:
        os.close(self._fd)


class JobLogWriter:
    """Appends a job's ``LogLines`` events to its node files (one writer: the owning kernel).

    A write that fails (disk full, quota) drops those lines, with one warning per job (a full
    disk lets a short line through now and then): losing log lines must not stop the job's
    state from being recorded.
    """

    def __init__(self, directory: Path, max_bytes: int = MAX_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._nodes: dict[int, _NodeFile] = {}
        self._warned = False
        try:  # a directory that cannot be made (a file is in the way) loses lines, not the job
            private_dir(directory)
        except OSError as exc:
            self._warn(exc)

    def write(self, event: LogLines, now: float | None = None) -> None:
        try:
            node = self._node(event.node)
            for rank, stream, lines in event.items:
                node.write(rank, stream, lines, now or time.time())
        except OSError as exc:
            self._warn(exc)

    def mark(self, nodes: int, text: str, now: float | None = None) -> None:
        """Mark where a job starts (``In[7] started 12:03:01``) in each of ``nodes`` files."""
        when = now or time.time()
        try:
            for number in range(nodes):
                self._node(number).write(MARK_RANK, "mark", (text,), when)
        except OSError as exc:
            self._warn(exc)

    def _node(self, number: int) -> _NodeFile:
        node = self._nodes.get(number)
        if node is None:
            node = self._nodes[number] = _NodeFile(
                self.directory / f"node-{number}.log", self.max_bytes
            )
        return node

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            log.warning(
                "jupyter_mn: cannot write logs to %s (%s); dropping lines until it works",
                self.directory,
                exc.strerror or exc,
            )
        self._warned = True

    def close(self) -> None:
        for node in self._nodes.values():
            node.close()
        self._nodes.clear()


def read_logs(
    directory: Path,
    *,
    node: int | None = None,
    rank: int | None = None,
    tail: int = 200,
    after: dict[int, int] | None = None,
) -> tuple[list[LogLine], dict[int, int]]:
    """The last ``tail`` lines (of ``node``/``rank`` when given) newer than the cursor ``after``.

    Returns them oldest first, with the cursor to pass next time (per node, the last ``seq`` seen,
    whether or not the rank filter kept that line).
    """
    after = after or {}
    found: list[LogLine] = []
    cursor: dict[int, int] = {}
    for number in nodes_with_logs(directory):
        if node is not None and number != node:
            continue
        start = after.get(number, 0)
        lines, last = _newest(directory, number, rank, tail, start)
        cursor[number] = max(last, start)
        found += lines
    found.sort(key=lambda line: (line.time, line.node, line.seq))
    found = Marks().fresh(found)
    return found[-tail:] if tail else [], cursor


class Marks:
    """Passes each mark once: every node's file has it, and a follower may read one node's
    copy in one poll and another's in the next (its text holds the time it was written)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def fresh(self, lines: list[LogLine]) -> list[LogLine]:
        kept = []
        for line in lines:
            if line.is_mark:
                if line.text in self._seen:
                    continue
                self._seen.add(line.text)
            kept.append(line)
        return kept


def nodes_with_logs(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(m[1]) for p in directory.iterdir() if (m := _NODE_FILE.match(p.name)))


def parse_cursor(text: str | None) -> dict[int, int]:
    """``"0:12,1:40"`` → ``{0: 12, 1: 40}`` (the form the REST API and the CLI pass around)."""
    cursor: dict[int, int] = {}
    for part in (text or "").split(","):
        if part:
            node, _, seq = part.partition(":")
            cursor[int(node)] = int(seq)
    return cursor


def format_cursor(cursor: dict[int, int]) -> str:
    return ",".join(f"{node}:{seq}" for node, seq in sorted(cursor.items()))


def _newest(
    directory: Path, node: int, rank: int | None, tail: int, start: int
) -> tuple[list[LogLine], int]:
    path = directory / f"node-{node}.log"
    found: list[LogLine] = []
    seen: set[int] = set()
    last = 0
    for raw in _chain(path, path.with_name(path.name + ".1")):
        line = _parse(node, raw)
        if line is None or line.seq in seen:
            continue  # a line rotated while we read shows up twice
        seen.add(line.seq)
        last = max(last, line.seq)
        if line.seq <= start or len(found) >= tail:
            break
        if rank is None or line.rank in (rank, MARK_RANK):
            found.append(line)
    found.reverse()
    return found, last


def _chain(*paths: Path) -> Iterator[bytes]:
    for path in paths:
        try:
            with path.open("rb") as f:
                yield from _reversed_lines(f)
        except FileNotFoundError:
            continue


def _reversed_lines(f: BinaryIO) -> Iterator[bytes]:
    """Complete lines from the end of ``f`` backwards (a line still being written is skipped)."""
    pos, rest, trailing = f.seek(0, os.SEEK_END), b"", True
    while pos > 0:
        size = min(_BLOCK, pos)
        pos -= size
        f.seek(pos)
        parts = (f.read(size) + rest).split(b"\n")
        rest = parts.pop(0)
        if trailing and parts:
            parts.pop()  # what follows the last newline: nothing, or a line being written
            trailing = False
        yield from reversed(parts)
    if rest and not trailing:
        yield rest


def _parse(node: int, raw: bytes) -> LogLine | None:
    parts = raw.decode("utf-8", "replace").split("\t", 4)
    if len(parts) != 5:
        return None
    seq, when, rank, stream, text = parts
    try:
        return LogLine(node, int(seq), float(when), int(rank), stream, text)
    except ValueError:
        return None
