"""What ``/proc`` shows of a rank forked from its node's template: the rank's own command line
and environment, as a new process's.

``/proc/PID/cmdline`` and ``/proc/PID/environ`` show the memory that held a process's argv and
environment strings at its exec: a forked rank would show its template's. ``ps``, psutil, the
tests and ``jupyter mn gc`` (the ``JUPYTER_MN_JOB`` mark) read them, so the template starts with
room in both (a command no shorter than a rank's, a padding variable, ``ROOM``) and each rank
writes its own strings there (setproctitle's technique for the command line), NUL-padded. The
agent forks a rank only when they fit (``fits``). A leaf, stdlib only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The template's padding variable, and its size: a rank's environment may be this much larger.
ROOM = "JUPYTER_MN_TEMPLATE_ROOM"
ROOM_BYTES = 32 * 1024


def strings(items: Iterable[str]) -> bytes:
    """Strings as the kernel lays them out for a new process: each ends with a NUL."""
    return b"".join(s.encode(errors="surrogateescape") + b"\0" for s in items)


def variables(env: Mapping[str, str]) -> bytes:
    return strings(f"{k}={v}" for k, v in env.items())


def _areas() -> tuple[int, int, int, int]:
    """Where this process's command line and environment strings are: ``/proc/self/stat``'s
    fields 48-51 (arg_start, arg_end, env_start, env_end)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(f) for f in fields[45:49])
    return arg_start, arg_end, env_start, env_end


def room() -> tuple[int, int]:
    """The bytes this process's command line and environment take: what a forked rank has."""
    arg_start, arg_end, env_start, env_end = _areas()
    return arg_end - arg_start, env_end - env_start


def fits(argv: list[str], env: Mapping[str, str], space: tuple[int, int]) -> bool:
    """Whether a rank's ``argv`` and ``env`` fit in a template's ``room()``."""
    return len(strings(argv)) <= space[0] and len(variables(env)) <= space[1]


def show(argv: list[str], env: Mapping[str, str]) -> None:
    """Write ``argv`` and ``env`` where ``/proc`` reads this process's (in a forked rank, after
    ``os.environ`` was cleared: no C ``environ`` entry points there any more)."""
    arg_start, arg_end, env_start, env_end = _areas()
    _write(arg_start, arg_end, _command_line(argv, arg_end - arg_start))
    _write(env_start, env_end, variables(env).ljust(env_end - env_start, b"\0"))


def _command_line(argv: list[str], room: int) -> bytes:
    """``argv`` as the kernel laid it out where it takes the room exactly (the rank runtime's
    command is as long as the template's); else as one title, its last byte not a NUL, which
    the kernel reads up to the first NUL (setproctitle's form: psutil splits it at spaces)."""
    exact = strings(argv)
    if len(exact) == room:
        return exact
    return (" ".join(argv).encode(errors="surrogateescape") + b"\0").ljust(room - 1, b"\0") + b" "


def _write(start: int, end: int, data: bytes) -> None:
    if len(data) == end - start:
        ctypes.memmove(start, data, len(data))
