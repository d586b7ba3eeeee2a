"""Container entrypoint of a Kubernetes gang pod: ``python -m jupyter_mn.node.pod``.

Each pod runs one dask worker named after its node rank (the Job completion index), which hosts
the node agent exactly as on the local backend; pod 0 also runs the dask scheduler
(``entry.py``). Control traffic is TLS with the gang's certificates from its Secret. The pod
reports Ready (a TCP port opens) once its worker has registered. A dead kernel leaves a finished
Job that its TTL then deletes (``entry.py``'s dead-man switch).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping

from distributed.security import Security

from ..wire.tlsfiles import TLS_FILES
from .entry import security_of, serve_node


def security_from(tls_dir: str) -> Security:
    """The gang's TLS settings from the files of its Secret."""
    ca, cert, key = (os.path.join(tls_dir, f) for f in TLS_FILES)
    return security_of(ca, cert, key)


async def serve(env: Mapping[str, str]) -> None:
    """Run this pod's part of the gang until the worker closes (or SIGTERM)."""
    port = int(env["JUPYTER_MN_DASK_PORT"])
    await serve_node(
        node=int(env["NODE_RANK"]),
        host=env["POD_IP"],
        scheduler=env["JUPYTER_MN_SCHEDULER"],
        port=port,
        security=security_from(env["JUPYTER_MN_TLS_DIR"]),
        orphan_timeout=float(env["JUPYTER_MN_ORPHAN_TIMEOUT"]),
        connect_timeout=float(env["JUPYTER_MN_CONNECT_TIMEOUT"]),
        ready_port=port + 1,
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(os.environ))


if __name__ == "__main__":
    main()
