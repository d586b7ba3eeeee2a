"""Everything that runs on the nodes: the node agent (a dask actor) and the rank processes.

Nothing here is imported by the kernel side at import time, and the rank processes never import
the kernel side's heavy dependencies (IPython kernel, widgets).
"""
