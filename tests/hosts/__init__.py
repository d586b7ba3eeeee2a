"""Gangs on test hosts (network namespaces, as root)."""
