"""Measurements, run from the repository root as ``python -m bench.NAME`` (docs/performance.md)."""
