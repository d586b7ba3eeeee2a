"""What runs inside a rank process: its main loop, cell execution, group abort, timing, stacks.

A rank process is started by its node agent (``jupyter_mn.node``) as ``python -m
jupyter_mn.rank.runtime``. Nothing here imports the kernel side or the node agent, and the kernel
side never imports this package at import time.
"""
