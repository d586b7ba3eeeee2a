"""Entry point of a Slurm gang's job step: ``python -m jupyter_mn.node.slurm``, one task per node.

The same node as a Kubernetes pod (``entry.serve_node``): task 0 runs the TLS dask scheduler with
the ``OrphanGuard``, every task one worker (named after its task rank, the node rank) that hosts
the node agent; the kernel connects back to task 0. Where the scheduler is: the kernel names it
(``JUPYTER_MN_SCHEDULER_HOST``, a step inside an existing allocation), else it is the host that
launched the step, which for a batch job is its first node (``SLURM_LAUNCH_NODE_IPADDR``). The
gang's TLS certificate is in files of a 0700 directory the kernel wrote in its Jupyter runtime
dir (the shared home), named by ``JUPYTER_MN_TLS_DIR``: never in the batch script or the job's
environment, which slurmctld keeps (and the accounting database may store). Each task reads them
once; the kernel deletes them when the gang is up.

Dead-man switch as in pods: the scheduler closes when no kernel has been connected for
``JUPYTER_MN_ORPHAN_TIMEOUT`` seconds, the workers follow, the step and then the job end.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from ..wire.tlsfiles import TLS_DIR_VAR, TLS_FILES, tls_address
from .entry import security_of, serve_node
from .netif import route


def read_tls(tls_dir: str) -> tuple[str, ...]:
    """The PEM texts of the gang's certificate files; a clear exit where the node cannot see
    them (the Jupyter runtime dir is not on a file system the nodes share)."""
    try:
        return tuple(Path(tls_dir, name).read_text() for name in TLS_FILES)
    except OSError as exc:
        raise SystemExit(
            f"jupyter_mn: cannot read the gang's TLS files in {tls_dir} ({exc.strerror}): the "
            "kernel's Jupyter runtime dir must be on a file system the nodes share "
            "(JUPYTER_RUNTIME_DIR)"
        ) from None


async def serve(env: Mapping[str, str]) -> None:
    """This task's node of the gang, until its worker closes."""
    ca, cert, key = read_tls(env[TLS_DIR_VAR])
    scheduler_host = env.get("JUPYTER_MN_SCHEDULER_HOST") or env["SLURM_LAUNCH_NODE_IPADDR"]
    port = int(env["JUPYTER_MN_DASK_PORT"])
    own = route(scheduler_host, [])["ip"] or scheduler_host  # the address the others reach
    await serve_node(
        node=int(env["SLURM_PROCID"]),
        host=own,
        scheduler=tls_address(scheduler_host, port),
        port=port,
        security=security_of(ca, cert, key),
        orphan_timeout=float(env["JUPYTER_MN_ORPHAN_TIMEOUT"]),
        connect_timeout=float(env["JUPYTER_MN_CONNECT_TIMEOUT"]),
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(os.environ))


if __name__ == "__main__":
    main()
