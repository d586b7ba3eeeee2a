"""What a gang's ranks hold of the notebook's names, and the ``CellPayload`` a cell ships.

A cell reads notebook names: each is captured (``cell.py``) unless a cell defined it on the ranks
(it stays rank-local, unless pushed); a large one goes once and then as its digest, as long as
the same rank processes run (a restart or a new gang holds none), except to a gang all on this
host, where sending it again costs less than its digest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..wire.payload import CellPayload
from .cell import Shipper, bound_names, compile_cell

if TYPE_CHECKING:
    from ..gang.base import Gang


class RankNames:
    """The notebook names one cluster's ranks hold: those cells defined there, the large ones
    shipped already (``Shipper``'s cache) and the rank processes that cache is about."""

    def __init__(self) -> None:
        self._shipper = Shipper()
        self._defined: set[str] = set()
        #: the rank processes (gang id, incarnation) the shipper's cache of names is about
        self._ranks: tuple[str, int] | None = None

    def payload(
        self,
        code: str,
        cell_id: int,
        namespace: Mapping[str, Any] | None,
        push: Iterable[str],
        **options: Any,
    ) -> CellPayload:
        """``code`` as a payload, with the names it reads from ``namespace`` captured (bad input
        raises: nothing started); ``options``: the payload's other fields."""
        python = compile_cell(code)
        names, notes = self._shipper.capture(
            python, namespace or {}, rank_defined=self._defined, push=push
        )
        defines = tuple(sorted(bound_names(python)))
        return CellPayload(code, cell_id, names, defines=defines, notes=notes, **options)

    def ran(self, payload: CellPayload) -> None:
        """``payload`` ran: the names it defines live on the ranks now."""
        self._defined.update(payload.defines)

    def for_ranks(self, payload: CellPayload, gang: Gang) -> CellPayload:
        """``payload`` as ``gang``'s ranks get it: the large names they already hold as digests;
        new rank processes hold none. A gang whose agents are all on this host gets them every
        time (``Shipper.for_ranks``)."""
        ranks = (gang.core.id, gang.generations.incarnation)
        if ranks != self._ranks:
            self._shipper.forget()
            self._ranks = ranks
        cache = not gang.core.nodes.on_this_host()
        return dataclasses.replace(payload, names=self._shipper.for_ranks(payload.names, cache))

    def forget(self) -> None:
        """The gang went: its ranks hold nothing."""
        self._shipper.forget()
        self._defined.clear()
