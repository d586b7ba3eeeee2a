"""Keep JupyterLab's kernel status right while a cell runs: subshell requests are not activity.

ipykernel (7.x) publishes a busy/idle pair on IOPub for every control request, and JupyterLab
(4.5+) shows the last status it received, except for replies to the message types the server
lists in ``MappingKernelManager.untracked_message_types`` (served to the page as the page config
``untracked_message_types``). That list names ``debug_request`` but not the kernel-subshell
requests (JEP 91), which Lab sends when a widget's comm opens, as in the first ``%%cluster`` cell
of a kernel: their "idle" made the status bar say Idle for the rest of the running cell. Neither
jupyter_server nor ipykernel has changed this upstream; this adds the subshell requests to the
list, keeping any the user configured. The server's activity tracking (used to cull idle kernels)
reads the same list: a subshell opened by the page is no user activity either.
"""

from __future__ import annotations

from typing import Any

#: Control requests of kernel subshells (JEP 91) and their replies.
SUBSHELL_MESSAGES = tuple(
    f"{verb}_subshell_{kind}"
    for verb in ("create", "delete", "list")
    for kind in ("request", "reply")
)


def untrack_subshell_messages(server_app: Any) -> None:
    """Add the subshell messages to the server's untracked list. The server loads its extensions
    in name order, so JupyterLab's and Notebook's (``jupyterlab``, ``notebook``) copy the list into
    the page config after this."""
    manager = server_app.kernel_manager
    if not hasattr(manager, "untracked_message_types"):
        return  # a kernel manager without activity tracking: Lab gets no list either
    listed = list(manager.untracked_message_types)
    manager.untracked_message_types = listed + [m for m in SUBSHELL_MESSAGES if m not in listed]
