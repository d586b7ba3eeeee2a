"""``--retries``: a cell whose rank was lost (or whose node was preempted) runs again once the
gang has recovered, as long as retries are left."""

from __future__ import annotations

from collections.abc import Callable

from ..model.result import LOST, CellResult
from ..wire.events import Note, OnEvent


def with_retries(
    attempt: Callable[[], CellResult],
    retries: int,
    on_event: OnEvent | None,
    stopped: Callable[[], bool],
) -> CellResult:
    """``attempt()`` and, while a rank was lost and retries are left, again; not once
    ``stopped()`` (the cost cap stopped it)."""
    for n in range(1 + retries):
        result = attempt()
        if result.ok or not retryable(result) or n == retries or stopped():
            return result
        if on_event is not None:
            on_event(Note(retry_text(n + 1, retries, result)))
    raise AssertionError("unreachable: the last attempt returns")


def retryable(result: CellResult) -> bool:
    """A rank was lost or a node preempted, and the user did not stop the cell."""
    if result.interrupted:
        return False
    cause = result.root_cause
    return result.preemption is not None or (cause is not None and cause.status == LOST)


def retry_text(attempt: int, retries: int, result: CellResult) -> str:
    cause = result.root_cause
    what = f"{cause.label if cause else 'a rank'} was lost"
    if result.preemption is not None:
        what = f"node {result.preemption.notice.node} was preempted"
    return f"retry {attempt}/{retries}: {what}; running the cell again"
