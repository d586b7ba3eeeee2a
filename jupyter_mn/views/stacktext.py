"""Every rank's stack as text, after the hang verdict when there is one: shown on
``--timeout``/Ctrl-C, by ``%cluster stacks`` and by a background cell's ``stacks()``."""

from __future__ import annotations

from ..wire.events import Stacks


def format_stacks(event: Stacks, verdict: bool = True) -> str:
    """The verdict (unless ``verdict`` is False: it was shown already), then every rank's
    stack, innermost last, under a ``[node N rank R]`` heading with the collective it is
    inside, if any."""
    lines = [f"jupyter_mn: hang: {event.verdict}"] if event.verdict and verdict else []
    lines.append(f"jupyter_mn: {event.reason}; where each rank is (innermost last):")
    for r in event.ranks:
        state = r.note or ("running" if r.busy else "idle (done with this cell)")
        inside = r.waiting() if r.busy else None
        if inside is not None:
            state += f", inside {inside.op} #{inside.seq} ({inside.group})"
        lines.append(f"[node {r.node} rank {r.rank}] {state}")
        lines += [f"    {line}" for line in r.stack]
    return "\n".join(lines)
