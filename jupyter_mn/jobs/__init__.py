"""The job registry and the jobs' logs: written by kernels, read by the Jupyter server and
the ``jupyter mn`` CLI."""
