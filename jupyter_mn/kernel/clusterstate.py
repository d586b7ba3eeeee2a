"""``ClusterState``: what a ``Cluster`` and its warm gang share, in one object.

The spec (the defaults of what runs next: a later cell's, once adopted), the lock that guards
the cluster, which job runs on it (``jobslot.py``) and the notebook names its ranks hold
(``shippednames.py``). ``WarmGang`` receives this, never the ``Cluster``, as a gang's parts
receive its ``GangCore``.
"""

from __future__ import annotations

import threading

from ..model.spec import ClusterSpec
from .jobslot import JobSlot
from .shippednames import RankNames


class ClusterState:
    """A cluster's spec, lock, job slot and shipped names."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.lock = threading.RLock()
        #: one job at a time, in the foreground or in the background
        self.slot = JobSlot(self.lock)
        #: the notebook names the ranks hold, forgotten with the gang
        self.names = RankNames()
