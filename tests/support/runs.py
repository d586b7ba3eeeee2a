"""Submitting a run as a user at a terminal does, for the detached-run tests of every backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

#: ``jupyter mn`` as this test's Python runs it (the worktree's code, whatever is on PATH).
JUPYTER_MN = [sys.executable, "-m", "jupyter_mn.cli"]
#: Seconds a command gets beyond the ``--wait`` it is given (30 without one, the commands'
#: default): the test outwaits the command, so it sees the command's own answer.
MARGIN_S = 60.0


def mn(*args: str, cwd: Path | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    """``jupyter mn ARGS``; with ``ok``, it must succeed."""
    wait = float(args[args.index("--wait") + 1]) if "--wait" in args else 30.0
    proc = subprocess.run(
        [*JUPYTER_MN, *args], capture_output=True, text=True, timeout=wait + MARGIN_S, cwd=cwd
    )
    assert proc.returncode == 0 or not ok, proc.stderr
    return proc


def submit_in_a_shell(*args: str) -> tuple[str, str]:
    """``jupyter mn submit ARGS`` from a terminal's shell that is killed, with its whole group,
    once submit has said the run's id and how to follow it: (the id, that line)."""
    shell = subprocess.Popen(
        ["bash", "-c", f"{' '.join(JUPYTER_MN)} submit {' '.join(args)}; sleep 600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        job_id, said = shell.stdout.readline().strip(), shell.stderr.readline()
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
    assert job_id, said
    return job_id, said
