"""The test suite: one folder per part of the package, plus end-to-end runs and shared helpers."""
