"""The dask settings of a cluster whose workers host node agents (local backend, Kubernetes pods).

A failed agent is not retried elsewhere (the gang re-forms instead), the worker may start rank
processes (not a daemon), and an agent's long actor calls are not reported as a blocked loop.
"""

from __future__ import annotations

DASK_CONFIG = {
    "distributed.scheduler.allowed-failures": 0,
    "distributed.worker.daemon": False,
    "distributed.nanny.pre-spawn-environ": {"MALLOC_TRIM_THRESHOLD_": 65536},
    "distributed.admin.tick.limit": "1h",
}
