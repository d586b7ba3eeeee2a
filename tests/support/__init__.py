"""Helpers the tests and bench/ share, imported by full name: real kernels, processes, test hosts,
Slurm, dask, Kubernetes, a JupyterLab server."""
