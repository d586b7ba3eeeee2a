"""Submitting a run as a user at a terminal does, for the detached-run tests of every backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

#: ``jupyter mn`` as this test's Python runs it (the worktree's code, whatever is on PATH).
JUPYTER_MN = [sys.executable, "-m", "jupyter_mn.cli"]


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
