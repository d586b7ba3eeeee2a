"""What looks like a credential: by its name, by its value, or held inside a value.

The cell's capture leaves such names in the notebook unless pushed (``cell.py``), the command
line recorded for a job is masked with it (``recorder.py``), a Slurm job's environment is
filtered with it (``gang/slurm/provision.py``) and files of the notebook's directory that look
like one stay behind (``workdir.py``). Best effort by design: a credential is recognised by a
name that says so (``*_PASSWORD``, ``MYSQL_PWD``, ``DB_PASS``), by a key-like text under a key's
name (``SIGNING_KEY``), or by a well-known shape (a PEM private key, a JWT, a provider's token
prefix, a URL with a password, a connection string's account key, a webhook URL). Values are
searched to the end: texts and bytes of any length, containers, object attributes and what a
function carries along (closure cells, default arguments, a ``functools.partial``'s arguments),
up to ``_TEXT_BUDGET`` characters and ``_ITEM_BUDGET`` items; a value larger than that is
treated as holding one (not sent unless pushed).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any

MASK = "***"
#: A name that says its value is a credential.
_NAME = re.compile(
    r"(?i)(passw(or)?d|passphrase|secret|token|api_?key|access_?key|credential|private_?key"
    r"|_pwd$|(^|_)pass$|sshpass|bindpw|_pw$|(^|_)auth$)"
)
#: A key's name (``SIGNING_KEY``, ``kaggle_key``): a credential when its text looks like one.
_KEY_NAME = re.compile(r"(?i)(^|_)key$")
#: A key's text: one word of 16 or more letters, digits (one at least) and base64's signs.
_KEY_TEXT = re.compile(r"[A-Za-z0-9+/=_-]{16,}")
_DIGIT = re.compile(r"\d")
#: Shapes of credentials, each found by a literal it holds (a fast search) and then its pattern:
#: PEM private keys, JWTs, URLs with a password (a port is no password, but ``u:123/abc@h``
#: has one), Azure connection strings' keys, ODBC connection strings' ``Password=…;``, Slack and
#: Discord webhooks, and the prefixes of OpenAI / Stripe (sk-, sk_, rk_), Hugging Face, GitHub,
#: GitLab, npm, PyPI, AWS (long-term and temporary), Google (API keys and OAuth access tokens)
#: and Slack tokens.
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("PRIVATE KEY-----", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
    ("eyJ", re.compile(r"eyJ(?<!\weyJ)[\w-]{6,}\.[\w-]{6,}\.[\w-]{6,}")),
    (
        "://",
        re.compile(r"://[^\s/:@]{0,256}:(?:(?!\d+(?:/|$))[^\s@]{1,256}|\d+/[^\s/@]{1,256})@"),
    ),
    ("AccountKey=", re.compile(r"AccountKey=[A-Za-z0-9+/]{16,}")),
    ("SharedAccessKey=", re.compile(r"SharedAccessKey=[A-Za-z0-9+/]{16,}")),
    (
        "hooks.slack.com/",
        re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[\w/-]{8,}"),
    ),
    ("/api/webhooks/", re.compile(r"discord(?:app)?\.com/api/webhooks/\d+/[\w-]{16,}")),
    ("ya29.", re.compile(r"ya29\.(?<!\wya29\.)[\w-]{16,}")),
    (
        ";",
        re.compile(
            r"(?im)(?:;[ \t]*(?:password|pwd)[ \t]*=[ \t]*[^;\s]"
            r"|^[ \t]*(?:password|pwd)[ \t]*=[ \t]*[^;\s][^;\n]*;)"
        ),
    ),
    *(
        (prefix, re.compile(rf"{re.escape(prefix)}(?<![A-Za-z0-9]{re.escape(prefix)})[\w-]{{16,}}"))
        for prefix in (
            *("sk-", "sk_", "rk_", "hf_", "github_pat_", "glpat-", "npm_", "pypi-"),
            *("AKIA", "ASIA", "AIza"),
            *(f"gh{c}_" for c in "pousr"),
            *(f"xox{c}-" for c in "abpr"),
        )
    ),
)
#: No shape above fits in fewer characters (``a://u:p@``).
_SHORTEST = 8
#: An option or a parameter's name (``--password``, ``api_key``), not a path or a value.
_WORD = re.compile(r"-{0,2}[A-Za-z_][\w.-]*")
#: Options whose value is ``NAME=VALUE``, each VALUE a secret whatever its name (``--env``).
_PAIR_OPTIONS = frozenset({"--env"})
#: The most a value is searched, in characters of text and in items held (a model's modules, a
#: dataset's rows): past either, the value is taken for one that holds a credential.
_TEXT_BUDGET = 16 << 20
_ITEM_BUDGET = 1 << 20
#: Containers deeper than this are not searched further, and taken for holding one.
_DEPTH = 32


@functools.lru_cache(maxsize=4096)  # a dataset's rows repeat their keys
def secret_name(name: str) -> bool:
    """``hf_token``, ``DB_PASSWORD``, ``MYSQL_PWD``: the name says it is a credential."""
    return bool(_NAME.search(name))


def secret_value(value: Any) -> bool:
    """A string or bytes shaped like a credential, searched to the end.

    >>> secret_value("postgres://me:hunter2@db/x"), secret_value("https://example.com:8080/@x")
    (True, False)
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("latin-1")  # byte for byte: the shapes are ASCII
    if not isinstance(value, str) or len(value) < _SHORTEST:
        return False
    return any(literal in value and pattern.search(value) for literal, pattern in _SHAPES)


def secret_item(name: str, value: Any) -> bool:
    """A text ``value`` known as ``name`` is a credential: by the name, by its shape, or a
    key-like text under a key's name (``SIGNING_KEY=3q2+7w…``, but not ``sort_key="date"``)."""
    if secret_name(name) or secret_value(value):
        return True
    return isinstance(value, str) and bool(_KEY_NAME.search(name)) and _key_text(value)


def _key_text(text: str) -> bool:
    return bool(_KEY_TEXT.fullmatch(text) and _DIGIT.search(text))


def holds_secret(name: str, value: Any) -> bool:
    """Whether ``value`` (known as ``name``) is or carries a credential: text under a credential's
    name or of a credential's shape, in a container, an object's attributes, a closure, a
    default argument or a ``functools.partial``; or is too large to search (``_TEXT_BUDGET``).

    >>> holds_secret("cfg", {"db": [{"url": "postgres://u:p/ss@db/x"}]})
    True
    """
    return _Search().holds(name, value, 0)


_TEXTS = (str, bytes, bytearray, memoryview)
#: Values that hold nothing: not looked into (a list of a million floats costs one pass).
_ATOMS = (int, float, complex, bool, type(None))
_ATOM_TYPES = frozenset(_ATOMS)
_SEQUENCES = (list, tuple, set, frozenset)


class _Search:
    """One value's search: what is left of the budgets, and the objects already looked into."""

    def __init__(self) -> None:
        self.text = _TEXT_BUDGET
        self.items = _ITEM_BUDGET
        self.seen: set[int] = set()

    def holds(self, name: str, value: Any, depth: int) -> bool:
        if isinstance(value, _TEXTS):
            self.text -= len(value)
            return self.text < 0 or secret_item(name, value)
        if isinstance(value, _ATOMS) or id(value) in self.seen:
            return False
        if depth >= _DEPTH:
            return True
        self.seen.add(id(value))
        if isinstance(value, _SEQUENCES):
            return self.sequence(name, value, depth)
        try:
            held = _held(name, value)
        except Exception:  # a proxy or a mapping that cannot be read: pickling it would fail too
            return False
        self.items -= len(held)
        return self.items < 0 or any(self.holds(n, v, depth + 1) for n, v in held)

    def sequence(self, name: str, items: Any, depth: int) -> bool:
        """A list, tuple or set: one name for every item, so their texts are searched as one
        (a million numbers cost one pass)."""
        self.items -= len(items)
        if self.items < 0:
            return True
        kinds = set(map(type, items))
        if kinds <= _ATOM_TYPES:
            return False
        if str in kinds and self.texts(name, [v for v in items if type(v) is str]):
            return True
        kinds -= _ATOM_TYPES | {str}
        rest = (v for v in items if type(v) in kinds) if kinds else ()
        return any(self.holds(name, v, depth + 1) for v in rest)

    def texts(self, name: str, texts: list[str]) -> bool:
        """Whether ``texts``, each known as ``name``, hold a credential (``secret_item``)."""
        self.text -= sum(map(len, texts))
        if self.text < 0 or secret_name(name) or secret_value("\n".join(texts)):
            return True
        return bool(_KEY_NAME.search(name)) and any(map(_key_text, texts))


def _held(name: str, value: Any) -> list[tuple[str, Any]]:
    """The (name, value) pairs ``value`` carries that pickling it would send along (a list's
    items: ``_Search.sequence``)."""
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, functools.partial):
        return [(name, value.func), *((name, a) for a in value.args), *value.keywords.items()]
    if isinstance(value, FunctionType):
        return _function_held(value)
    if isinstance(value, (type, ModuleType, BuiltinFunctionType)):
        return []
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return [(str(k), v) for k, v in attributes.items()]
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
    ``-p api_key …``), every ``--env NAME=VALUE``'s value (it is there to reach the ranks
    unseen, whatever its name) and any argument shaped like one.

    >>> mask_argv(["jupyter-lab", "--ServerApp.token=abc", "-p", "db_password", "pw", "x.ipynb"])
    ['jupyter-lab', '--ServerApp.token=***', '-p', 'db_password', '***', 'x.ipynb']
    >>> mask_argv(["jupyter mn", "submit", "--env", "WANDB=k1", "--env=SEED=7", "x.ipynb"])
    ['jupyter mn', 'submit', '--env', 'WANDB=***', '--env=SEED=***', 'x.ipynb']
    """
    masked: list[str] = []
    hide_next = pair_next = False
    for arg in argv:
        option, eq, value = arg.partition("=")
        if pair_next or (eq and option in _PAIR_OPTIONS):
            masked.append(_masked_pair(arg) if pair_next else f"{option}={_masked_pair(value)}")
            hide_next = pair_next = False
            continue
        pair_next = arg in _PAIR_OPTIONS
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


def _masked_pair(pair: str) -> str:
    """``NAME=VALUE`` as ``NAME=***``."""
    name, eq, _ = pair.partition("=")
    return f"{name}={MASK}" if eq else MASK
