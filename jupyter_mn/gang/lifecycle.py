"""The gang's lifecycle as one enum with its allowed moves (docs/architecture.md, "Gang states")."""

from __future__ import annotations

from ..wire.events import GangStatus

_MOVES: dict[GangStatus, frozenset[GangStatus]] = {
    GangStatus.PENDING: frozenset({GangStatus.SCHEDULING, GangStatus.CLOSED}),
    GangStatus.SCHEDULING: frozenset({GangStatus.RENDEZVOUS, GangStatus.BROKEN, GangStatus.CLOSED}),
    GangStatus.RENDEZVOUS: frozenset({GangStatus.READY, GangStatus.BROKEN, GangStatus.CLOSED}),
    GangStatus.READY: frozenset(
        {GangStatus.RUNNING, GangStatus.RENDEZVOUS, GangStatus.BROKEN, GangStatus.CLOSED}
    ),
    GangStatus.RUNNING: frozenset(
        {GangStatus.READY, GangStatus.RENDEZVOUS, GangStatus.BROKEN, GangStatus.CLOSED}
    ),
    GangStatus.BROKEN: frozenset({GangStatus.CLOSED}),
    GangStatus.CLOSED: frozenset(),
}


def allowed(old: GangStatus, new: GangStatus) -> bool:
    return new in _MOVES[old]
