"""Which log files ``jupyter mn logs JOB --node/--rank`` reads, and reading them as one.

A gang's lines are in its own files (``joblogs.py``). A submitted run has no nodes: its files
hold its kernel's output, where a ``%%cluster`` cell's rank lines are text of rank
``OUTPUT_RANK``. Filtered on a node or rank, a run is read from its gangs' files (each gang
filtered alike) beside its own marks (where each of its cells started); a gang its kernel makes
meanwhile joins a follower's next poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from .joblogs import MARK_RANK, LogLine, read_logs
from .registry import JobModel, Registry
from .runusage import gangs_of


@dataclass(frozen=True)
class LogSource:
    """One job's files, and the node and rank to keep of them (None: all)."""

    directory: Path
    node: int | None = None
    rank: int | None = None


def sources(
    registry: Registry, job: JobModel, node: int | None, rank: int | None
) -> list[LogSource]:
    """Where ``job``'s lines for ``node``/``rank`` are; a node or rank it has none of raises."""
    if not job.submitted or (node is None and rank is None):
        lacks = _lacks(job, node, rank)
        if lacks:
            raise SpecError(f"{lacks[0]}: job {job.id} has {lacks[1]}")
        return [_source(registry, job, node, rank)]
    gangs = gangs_of(registry.jobs(), job.id)
    having = [gang for gang in gangs if not _lacks(gang, node, rank)]
    if not having:
        flag = f"--node {node}" if node is not None else f"--rank {rank}"
        made = ", ".join(f"{g.id} has {_lacks(g, node, rank)[1]}" for g in gangs)
        raise SpecError(f"{flag}: no gang of run {job.id} has it ({made or 'it made none yet'})")
    own_marks = LogSource(registry.log_dir(job.id), rank=MARK_RANK)
    return [own_marks, *(_source(registry, gang, node, rank) for gang in having)]


def read(found: list[LogSource], tail: int, cursors: dict[Path, dict[int, int]]) -> list[LogLine]:
    """The last ``tail`` lines of ``found``, oldest first, after ``cursors`` (one per file set,
    advanced here)."""
    lines: list[LogLine] = []
    for source in found:
        new, cursors[source.directory] = read_logs(
            source.directory,
            node=source.node,
            rank=source.rank,
            tail=tail,
            after=cursors.get(source.directory),
        )
        lines += new
    lines.sort(key=lambda line: line.time)
    return lines[-tail:] if tail else []


def _source(registry: Registry, job: JobModel, node: int | None, rank: int | None) -> LogSource:
    """A rank filter reads only its node's file."""
    if node is None and rank is not None:
        node = job.node_of(rank)
    return LogSource(registry.log_dir(job.id), node, rank)


def _lacks(job: JobModel, node: int | None, rank: int | None) -> tuple[str, str] | None:
    """The flag naming what ``job`` lacks of ``node`` and ``rank``, and what it has instead."""
    if node is not None and not 0 <= node < len(job.nodes):
        return f"--node {node}", f"nodes 0–{len(job.nodes) - 1}" if job.nodes else "no nodes"
    if rank is not None and not 0 <= rank < job.world_size:
        return f"--rank {rank}", f"ranks 0–{job.world_size - 1}"
    return None
