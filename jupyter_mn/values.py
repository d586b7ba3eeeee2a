"""Checks of single values shared by ``spec.py`` and ``kubespec.py`` (which ``spec`` imports)."""

from __future__ import annotations

import math
from typing import Any


def is_number(value: Any, *, low: float, strict: bool = False) -> bool:
    """A finite real number ≥ ``low`` (> ``low`` when ``strict``). NaN and infinity are not:
    every comparison with NaN is false, and an infinite timeout overflows the timers.

    >>> is_number(float("nan"), low=0), is_number(2.5, low=0, strict=True)
    (False, True)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low
