"""What runs in a node's agent process (a dask worker): the node agent, its rank handles,
upkeep, telemetry, the functions the kernel runs on the worker, probes, and the pod entrypoint.

It imports downward only (``jupyter_mn.rank`` for the rank contract, never the kernel side's
``gang``/``views``); the kernel side imports it lazily, never at import time.
"""
