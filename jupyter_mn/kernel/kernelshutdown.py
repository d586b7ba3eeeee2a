"""Close every gang when the kernel is asked to shut down or restart, before ipykernel stops.

ipykernel answers a shutdown request by signalling every process of its group, the local dask
workers among them (their nannies start them again) and multiprocessing's resource tracker (it
ignores SIGTERM), and jupyter_client SIGTERMs a kernel still alive 2.5 s later: the interpreter's
atexit close never ran and the job read ORPHANED. So the request's own handler first closes the
gangs, then stops the resource tracker as interpreter exit would (it closes the tracker's pipe),
and the kernel exits cleanly in about 0.5 s.
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing.resource_tracker
import sys
from typing import Any


def close_gangs_first(kernel: Any) -> None:
    """Wrap the kernel's ``shutdown_request`` handlers (control and shell channels) once."""
    for handlers in (kernel.control_handlers, kernel.shell_handlers):
        original = handlers.get("shutdown_request")
        if original is None or getattr(original, "closes_gangs", False):
            continue

        async def shutdown_request(*args: Any, _original: Any = original) -> None:
            _release()
            result = _original(*args)
            if inspect.isawaitable(result):
                await result

        shutdown_request.closes_gangs = True  # type: ignore[attr-defined]
        handlers["shutdown_request"] = shutdown_request


def _release() -> None:
    cluster = sys.modules.get(f"{__package__}.cluster")  # not loaded: this kernel had no gang
    if cluster is not None:
        cluster.close_all()
    tracker = multiprocessing.resource_tracker._resource_tracker
    with contextlib.suppress(Exception):  # private since 3.8; without it the kernel is SIGTERMed
        tracker._stop()
