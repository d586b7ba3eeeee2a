"""This kernel's id on the Jupyter server: what ``/api/kernels/<id>`` and the registry name it by.

A Jupyter server starts each kernel with the connection file ``kernel-<id>.json``, where the id is
a UUID (``jupyter_client``'s ``new_kernel_id``). Other launchers name the file otherwise:
papermill's ``tmp….json``, a bare ``ipykernel`` ``kernel-<pid>.json``. Only a UUID is taken for an
id, so a pid or a temporary name never reaches the server as a kernel to interrupt.
"""

from __future__ import annotations

import os
import re
import sys

#: ``kernel-<UUID>.json``: the UUID in its 8-4-4-4-12 form, as the server's ``/api/kernels/<id>``
#: routes take it
_CONNECTION_FILE = re.compile(r"kernel-([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})\.json", re.I)


def kernel_id_of(connection_file: str | None) -> str | None:
    """The kernel id in a connection file's name (a path or a bare name), or None."""
    if not connection_file:
        return None
    match = _CONNECTION_FILE.fullmatch(os.path.basename(connection_file))
    return match[1] if match else None


def current_kernel_id() -> str | None:
    """This process's kernel id; None outside an ipykernel or under a launcher without one."""
    if "ipykernel" not in sys.modules:  # never import ipykernel into a plain Python process
        return None
    try:
        from ipykernel.connect import get_connection_file

        return kernel_id_of(get_connection_file())
    except Exception:  # an ipykernel module, but not a running kernel
        return None
