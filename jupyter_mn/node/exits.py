"""What the agent sees of a rank process from outside, in words: how it ended, or why it is
silent while it lives (its state in ``/proc``, through psutil)."""

from __future__ import annotations

import signal

import psutil

STOPPED = "no answer: its process is stopped (SIGSTOP or a debugger)"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return ""


def stopped(pid: int) -> bool:
    """A stopped process cannot answer: asking it would only cost the wait."""
    return _status(pid) in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def silent(pid: int) -> str:
    """Why a live rank does not answer: its process is stopped (SIGSTOP, a debugger), waits on
    the disk, or runs native code that holds the GIL."""
    if stopped(pid):
        return STOPPED
    if _status(pid) == psutil.STATUS_DISK_SLEEP:
        return "no answer: its process waits on the disk (uninterruptible)"
    return "no answer (native code holding the GIL?)"
