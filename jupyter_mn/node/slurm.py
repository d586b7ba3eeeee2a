"""Entry point of a Slurm gang's job step: ``python -m jupyter_mn.node.slurm``, one task per node.

The same node as a Kubernetes pod (``pod.serve_node``): task 0 runs the TLS dask scheduler with
the ``OrphanGuard``, every task one worker (named after its task rank, the node rank) that hosts
the node agent; the kernel connects back to task 0. Where the scheduler is: the kernel names it
(``JUPYTER_MN_SCHEDULER_HOST``, a step inside an existing allocation), else it is the host that
launched the step, which for a batch job is its first node (``SLURM_LAUNCH_NODE_IPADDR``). The
gang's TLS certificate arrives in the job's environment (never in the batch script) and is taken
out of it here, so the ranks do not inherit it.

Dead-man switch as in pods: the scheduler closes when no kernel has been connected for
``JUPYTER_MN_ORPHAN_TIMEOUT`` seconds, the workers follow, the step and then the job end.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import MutableMapping

from .netif import route
from .pod import security_of, serve_node

#: environment variables holding the gang's certificate (PEM text)
TLS_VARS = ("JUPYTER_MN_TLS_CA", "JUPYTER_MN_TLS_CERT", "JUPYTER_MN_TLS_KEY")


async def serve(env: MutableMapping[str, str]) -> None:
    """This task's node of the gang, until its worker closes."""
    ca, cert, key = (env.pop(var) for var in TLS_VARS)
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


def tls_address(host: str, port: int) -> str:
    """``tls://10.0.0.5:8786``, or ``tls://[fd00::5]:8786`` for an IPv6 address."""
    return f"tls://[{host}]:{port}" if ":" in host else f"tls://{host}:{port}"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(os.environ))


if __name__ == "__main__":
    main()
