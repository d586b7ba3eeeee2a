"""A rank's membership in torch.distributed, re-formed in place after a failure."""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from datetime import timedelta
from typing import Any

from . import abort
from .info import ClusterInfo


def store_listener(host: str, port: int) -> socket.socket:
    """Rank 0's listening socket for the TCPStore, on ``host`` (MASTER_ADDR) only.

    TCPStore's own server listens on every interface: on the local backend that would open the
    unauthenticated store to the network. Bound here, before torch is imported, it also holds the
    port from the first milliseconds of the rank. Falls back to every interface only where
    MASTER_ADDR is not an address of this host (a NAT'd ``--contact-address``).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise
        return socket.create_server(("", port))


class ProcessGroup:
    """The rank's membership in torch.distributed, re-formed in place after a failure.

    Rank 0 hosts the TCPStore; each generation uses its own key prefix, so a re-init never sees a
    stale key from the group it replaces. When rank 0 was restarted its store is new, and the
    other ranks reconnect to it (``reinit(..., reconnect=True)``).
    """

    def __init__(self, info: ClusterInfo, pg_timeout: float) -> None:
        self._listener = (
            store_listener(info.master_addr, info.master_port) if info.rank == 0 else None
        )
        import torch

        self.info = info
        self.pg_timeout = pg_timeout
        self.cuda = torch.cuda.is_available()
        self.backend = "nccl" if self.cuda else "gloo"
        self.generation = -1
        self._store: Any = None
        self._pg: Any = None
        self._old: Any = None
        self._sockets: dict[int, str] = {}
        #: when the current group was formed (``time.time_ns()``): the flight recorder's older
        #: entries belong to groups a re-forming destroyed
        self.formed_ns = 0
        if self.cuda:
            count = torch.cuda.device_count()
            if info.local_rank >= count:
                raise RuntimeError(
                    f"node {info.node_rank} has {count} GPU(s); "
                    f"local rank {info.local_rank} needs at least {info.local_rank + 1}"
                )
            torch.cuda.set_device(info.local_rank)

    def connect_store(self) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore(
            self.info.master_addr,
            self.info.master_port,
            world_size=None,
            is_master=self.info.rank == 0,
            timeout=timedelta(seconds=self.pg_timeout),
            wait_for_workers=False,
            master_listen_fd=None if self._listener is None else self._listener.fileno(),
        )

    def init(self, generation: int) -> None:
        import torch
        import torch.distributed as dist

        if self._store is None:
            self.connect_store()
        store = dist.PrefixStore(f"jupyter_mn/{generation}/", self._store)
        kwargs: dict[str, Any] = {}
        if self.cuda:
            kwargs["device_id"] = torch.device("cuda", self.info.local_rank)
        before = abort.open_sockets()
        self.formed_ns = time.time_ns()
        dist.init_process_group(
            self.backend,
            store=store,
            rank=self.info.rank,
            world_size=self.info.world_size,
            timeout=timedelta(seconds=self.pg_timeout),
            **kwargs,
        )
        self._sockets = abort.opened_since(before)
        self._pg = dist.group.WORLD
        self.generation = generation

    def destroy(self) -> None:
        """Leave the group so peers blocked on us fail at once (the fail-fast cascade).

        Idempotent. Objects that still hold the old group (a DDP model) get errors if used.
        The group object itself is kept until ``release``: its destructor joins gloo's threads,
        which is time better spent after the reply has gone.
        """
        import torch.distributed as dist

        if self._pg is None:
            return
        if self.cuda:
            with contextlib.suppress(Exception):  # NCCL: communicator abort unblocks kernels
                dist.distributed_c10d._abort_process_group()
        else:
            abort.shut_down(self._sockets, spare_port=self.info.master_port)
        if dist.is_initialized():
            dist.destroy_process_group()
        self._old, self._pg, self._sockets = self._pg, None, {}

    def abort(self, generation: int) -> None:
        """Close group ``generation``'s connections from another thread (the stacks thread, on
        an interrupt): a main thread blocked in a collective, which SIGINT does not reach, fails
        at once, and so do the peers it waits with. ``destroy`` still runs on the main thread."""
        if generation != self.generation or self._pg is None:
            return
        if self.cuda:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.distributed_c10d._abort_process_group()
        else:
            abort.shut_down(dict(self._sockets), spare_port=self.info.master_port)

    def release(self) -> None:
        self._old = None

    def reinit(self, generation: int, reconnect: bool = False) -> None:
        self.destroy()
        self.release()
        if reconnect:
            self.connect_store()
        self.init(generation)
