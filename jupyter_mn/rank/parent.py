"""A rank must not outlive its node agent: a lost agent means a lost node, and nobody would stop
what it left. A leaf (stdlib only), so light stand-in ranks (tests/, bench/) use it too."""

from __future__ import annotations

import os
import threading
import time

_PARENT_POLL_S = 1.0


def exit_with_parent() -> None:
    """Exit (code 70) within a second once the parent process (the agent) is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="jupyter-mn-parent-watch", daemon=True).start()
