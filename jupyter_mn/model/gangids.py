"""What a gang is called: its unique id, and the Kubernetes-safe forms of the user's name.

The user's ``--name`` is for people: the cell's title, ``jupyter mn list``, an annotation and a
label on the Kubernetes objects. It never identifies a gang, because two notebooks may both call
theirs "train" on one dask scheduler or in one namespace. The gang id names everything a gang
owns there (dask actor keys and event topics, the Job, Service, Secret, pods, the gang label,
the registry's job id), so it is unique per ``Gang``; it stays readable by starting with the
name. Leaf module: nothing in ``jupyter_mn`` is imported here.
"""

from __future__ import annotations

import hashlib
import re
import secrets

#: Longest gang id: the Job controller names pods ``<id>-<index>-<5 random>``, and a pod's name
#: is also its DNS hostname (≤ 63 characters) with an index up to 65535.
MAX_ID = 44
#: Longest ``--name`` (it is shown and stored whole, in the registry and an annotation).
MAX_NAME = 128
#: Longest label value Kubernetes accepts.
MAX_LABEL_VALUE = 63
_RANDOM_HEX = 8
_HASH_HEX = 6
_PREFIX = "jmn"
_NOT_DNS = re.compile(r"[^a-z0-9]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def _shorten(cleaned: str, original: str, limit: int, ends: str) -> str:
    """``cleaned`` cut to ``limit`` characters, ending in a hash of ``original`` when cut, so
    two long names with one beginning stay apart."""
    if len(cleaned) <= limit:
        return cleaned
    digest = hashlib.sha256(original.encode()).hexdigest()[:_HASH_HEX]
    return f"{cleaned[: limit - _HASH_HEX - 1].rstrip(ends)}-{digest}"


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as a DNS-1123 label that starts with a letter (so also a DNS-1035 label, which
    Service names must be): lowercase, each run of other characters one ``-``, at most ``limit``.

    >>> dns_label("My_Sweep_03")
    'my-sweep-03'
    >>> dns_label("2024 run")
    'jmn-2024-run'
    """
    label = _NOT_DNS.sub("-", text.lower()).strip("-")
    if not label[:1].isalpha():
        label = f"{_PREFIX}-{label}".rstrip("-")
    return _shorten(label, text, limit, "-")


def gang_id(name: str | None = None) -> str:
    """A new gang id: ``<name as a DNS label>-<8 random hex>`` (``jmn-…`` without a name).

    Unique (32 random bits per gang), a valid DNS-1035 label, at most ``MAX_ID`` characters.

    >>> gang_id("My_Sweep_03")  # doctest: +SKIP
    'my-sweep-03-5f3a9c2e'
    """
    base = dns_label(name, MAX_ID - _RANDOM_HEX - 1) if name else _PREFIX
    return f"{base}-{secrets.token_hex(_RANDOM_HEX // 2)}"


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at
    both ends (``My_Sweep_03`` stays as it is; ``my sweep/03`` becomes ``my-sweep-03``)."""
    value = _NOT_LABEL.sub("-", text).strip("-._")
    return _shorten(value, text, MAX_LABEL_VALUE, "-._")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a gang's display name, or None (any printable text will do)."""
    if not name.strip():
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if not name.isprintable():
        return "contains control characters"
    return None
