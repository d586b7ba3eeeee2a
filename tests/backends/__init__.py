"""The backends: local, dask, Slurm, Kubernetes (on the emulated and the real control plane)."""
