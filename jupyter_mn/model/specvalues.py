"""Checks of single values shared by ``spec.py``, ``kubespec.py`` and ``slurmspec.py`` (which
``spec`` imports), and the typed reading of a backend's ``JUPYTER_MN_<BACKEND>_<OPTION>``
variables."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import SpecError


def is_number(value: Any, *, low: float, strict: bool = False) -> bool:
    """A finite real number ≥ ``low`` (> ``low`` when ``strict``). NaN and infinity are not:
    every comparison with NaN is false, and an infinite timeout overflows the timers.

    >>> is_number(float("nan"), low=0), is_number(2.5, low=0, strict=True)
    (False, True)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low


def env_value(var: str, raw: str, f: dataclasses.Field[Any]) -> Any:
    """The text of variable ``var`` typed like the options field ``f``: a number, a flag
    (1/true/yes/on), a comma-separated tuple, else the text itself."""
    kind = str(f.type)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise SpecError(f"{var}={raw!r} is not a number") from None
    if kind == "bool":
        return raw.lower() in ("1", "true", "yes", "on")
    if kind.startswith("tuple"):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    return raw


def check_names(options: type, values: Mapping[str, Any], what: str) -> None:
    """Refuse names in ``values`` that are no field of the options dataclass ``options``."""
    unknown = set(values) - {f.name for f in dataclasses.fields(options)}
    if unknown:
        raise SpecError(f"unknown {what} option(s): {', '.join(sorted(unknown))}")


def options_from_environ(
    options: type,
    prefix: str,
    environ: Mapping[str, str],
    parse: Callable[[str, str, dataclasses.Field[Any]], Any] = env_value,
) -> dict[str, Any]:
    """The fields of the options dataclass ``options`` set as ``<prefix><FIELD>`` variables
    (empty ones are unset), typed by ``parse``."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        var = prefix + f.name.upper()
        raw = environ.get(var, "")
        if raw:
            values[f.name] = parse(var, raw, f)
    return values
