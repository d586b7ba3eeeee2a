"""Real kernels and notebooks end to end (papermill, the README's scripts)."""
