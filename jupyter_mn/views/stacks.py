"""Every rank's stack as text: shown on ``--timeout``/Ctrl-C, by ``%cluster stacks`` and by a
background cell's ``stacks()``."""

from __future__ import annotations

from ..events import Stacks


def format_stacks(event: Stacks) -> str:
    """Every rank's stack, innermost last, under a ``[node N rank R]`` heading."""
    lines = [f"jupyter_mn: {event.reason}; where each rank is (innermost last):"]
    for node, rank, busy, stack, note in event.ranks:
        state = note or ("running" if busy else "idle (done with this cell)")
        lines.append(f"[node {node} rank {rank}] {state}")
        lines += [f"    {line}" for line in stack]
    return "\n".join(lines)
