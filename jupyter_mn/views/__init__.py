"""Views: how a cell's events are shown (text now; widgets where a frontend renders them)."""

from .text import TextView

__all__ = ["TextView"]
