"""A count and its noun, as every message and view writes one (``1 rank``, ``3 lines``)."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is one: ``counted(2, "other rank")`` is
    ``2 other ranks`` (regular nouns only: the ones the views and errors count)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
