"""What looks like a credential: by its name, by its value, or held inside a value.

The cell's capture leaves such names in the notebook unless pushed (``cell.py``), and the
command line recorded for a job is masked with it (``recorder.py``). Best effort by design: a
credential is recognised by a name that says so or by a well-known shape (a PEM private key, a
JWT, a provider's token prefix, a URL with a password), looked for in strings, bytes, small
containers, and what a function carries along (closure cells, default arguments, a
``functools.partial``'s arguments); an attribute of an arbitrary object is not looked into.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from types import FunctionType
from typing import Any

MASK = "***"
#: A name that says its value is a credential.
_NAME = re.compile(
    r"(?i)(passw(or)?d|passphrase|secret|token|api_?key|access_?key|credential|private_?key)"
)
#: Shapes of credentials: PEM private keys, JWTs, URLs with a password, and the prefixes of
#: OpenAI / Stripe (sk-, sk_), Hugging Face, GitHub, GitLab, AWS, Google and Slack tokens.
_VALUE = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
    r"|\beyJ[\w-]{6,}\.[\w-]{6,}\.[\w-]{6,}"
    r"|\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]*:[^\s/@]+@"
    r"|(?<![A-Za-z0-9])(sk[-_]|hf_|gh[pousr]_|github_pat_|glpat-|xox[abpr]-|AKIA|AIza)"
    r"[A-Za-z0-9_-]{16,}"
)
#: An option or a parameter's name (``--password``, ``api_key``), not a path or a value.
_WORD = re.compile(r"-{0,2}[A-Za-z_][\w.-]*")
#: Longer texts are not searched (a dataset in a string is no credential, and costs time).
_LONGEST = 1 << 16
#: Containers are looked into this deep and this wide.
_DEPTH, _WIDTH = 3, 64


def secret_name(name: str) -> bool:
    """``hf_token``, ``DB_PASSWORD``, ``openai_api_key``: the name says it is a credential."""
    return bool(_NAME.search(name))


def secret_value(value: Any) -> bool:
    """A string or bytes shaped like a credential.

    >>> secret_value("postgres://me:hunter2@db/x"), secret_value("https://example.com/x")
    (True, False)
    """
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[:_LONGEST]).decode("utf-8", "replace")
    return isinstance(value, str) and len(value) <= _LONGEST and bool(_VALUE.search(value))


def holds_secret(name: str, value: Any, depth: int = 0) -> bool:
    """Whether ``value`` (known as ``name``) is or carries a credential: text under a credential's
    name or of a credential's shape, in a small container, a closure, a default argument or a
    ``functools.partial``."""
    if isinstance(value, (str, bytes, bytearray)):
        return secret_name(name) or secret_value(value)
    if depth >= _DEPTH:
        return False
    return any(holds_secret(n, v, depth + 1) for n, v in _held(name, value))


def _held(name: str, value: Any) -> list[tuple[str, Any]]:
    """The (name, value) pairs ``value`` carries that pickling it would send along."""
    if isinstance(value, Mapping) and len(value) <= _WIDTH:
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)) and len(value) <= _WIDTH:
        return [(name, item) for item in value]
    if isinstance(value, functools.partial):
        return [(name, value.func), *((name, a) for a in value.args), *value.keywords.items()]
    if isinstance(value, FunctionType):
        return _function_held(value)
    return []


def _function_held(fn: FunctionType) -> list[tuple[str, Any]]:
    code = fn.__code__
    held: list[tuple[str, Any]] = []
    for var, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
        try:
            held.append((var, cell.cell_contents))
        except ValueError:  # an empty cell: the variable is not bound yet
            continue
    defaults = fn.__defaults__ or ()
    params = code.co_varnames[: code.co_argcount]
    held += zip(params[len(params) - len(defaults) :], defaults, strict=True)
    held += (fn.__kwdefaults__ or {}).items()
    return held


def mask_argv(argv: list[str]) -> list[str]:
    """A command line with what looks like a credential replaced by ``***``: the value of an
    option named like one (``--IdentityProvider.token=…``, ``--password …``, papermill's
    ``-p api_key …``) and any argument shaped like one.

    >>> mask_argv(["jupyter-lab", "--ServerApp.token=abc", "-p", "db_password", "pw", "x.ipynb"])
    ['jupyter-lab', '--ServerApp.token=***', '-p', 'db_password', '***', 'x.ipynb']
    """
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        option, eq, _ = arg.partition("=")
        if hide_next or secret_value(arg):
            masked.append(f"{option}={MASK}" if eq and not hide_next else MASK)
            hide_next = False
            continue
        if eq and option.startswith("-") and secret_name(option):
            masked.append(f"{option}={MASK}")
            continue
        masked.append(arg)
        hide_next = bool(_WORD.fullmatch(arg)) and secret_name(arg)
    return masked
