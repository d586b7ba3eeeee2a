"""The dask settings of a cluster whose workers host node agents (local backend, Kubernetes pods).

A failed agent is not retried elsewhere (the gang re-forms instead), the worker may start rank
processes (not a daemon), and an agent's long actor calls are not reported as a blocked loop.
Dask does not watch the GPUs itself: the agent samples them (``node/gpu.py``), and dask's monitor
opens the first ``CUDA_VISIBLE_DEVICES`` entry by index or whole UUID at start, so an entry CUDA
accepts but NVML does not (a UUID prefix, an index NVML orders otherwise) stops the process.
"""

from __future__ import annotations

DASK_CONFIG = {
    "distributed.scheduler.allowed-failures": 0,
    "distributed.worker.daemon": False,
    "distributed.nanny.pre-spawn-environ": {"MALLOC_TRIM_THRESHOLD_": 65536},
    "distributed.admin.tick.limit": "1h",
    "distributed.diagnostics.nvml": False,
}
