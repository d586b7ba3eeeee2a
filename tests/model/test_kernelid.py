"""One rule for the kernel id, where the recorder and the widget each had their own.

The recorder took anything in ``kernel-(.+)\\.json`` (the file's name); the widget searched the
whole path for ``kernel-([0-9a-f-]+)\\.json$``. The ``old`` column says what those two rules
(``_recorder_rule``, ``_widget_rule``) returned: they disagreed, and where they agreed they could
both be wrong (a pid or a name without hyphens is no id the server routes).
"""

import os
import re

import pytest
from jupyter_client.multikernelmanager import MultiKernelManager

from jupyter_mn.model.kernelid import current_kernel_id, kernel_id_of

UUID = "0c6f3f4e-2f1a-4d0b-9a47-5d1e8c3b7a21"


def _recorder_rule(path: str) -> str | None:
    match = re.fullmatch(r"kernel-(.+)\.json", os.path.basename(path))
    return match[1] if match else None


def _widget_rule(path: str) -> str | None:
    found = re.search(r"kernel-([0-9a-f-]+)\.json$", path)
    return found[1] if found else None


@pytest.mark.parametrize(
    ("connection_file", "expected", "old"),
    [
        (f"kernel-{UUID}.json", UUID, (UUID, UUID)),
        (f"/home/u/.local/share/jupyter/runtime/kernel-{UUID}.json", UUID, (UUID, UUID)),
        (f"kernel-{UUID.upper()}.json", UUID.upper(), (UUID.upper(), None)),
        ("", None, (None, None)),  # no connection file
        ("/tmp/tmpa1b2c3d4.json", None, (None, None)),  # papermill / nbclient's KernelManager
        ("kernel-12345.json", None, ("12345", "12345")),  # a bare ipykernel: its pid
        ("kernel-v2.json", None, ("v2", None)),
        (f"/runtime/my-kernel-{UUID}.json", None, (None, UUID)),
        (f"/runtime/kernel-{UUID}/conn.json", None, (None, None)),
        (f"kernel-{UUID}.json.bak", None, (None, None)),
        (f"kernel-{UUID.replace('-', '')}.json", None, (UUID.replace("-", ""),) * 2),
    ],
)
def test_the_kernel_id_is_the_uuid_in_the_connection_file_name(connection_file, expected, old):
    assert kernel_id_of(connection_file) == expected
    assert (_recorder_rule(connection_file), _widget_rule(connection_file)) == old


def test_no_connection_file_has_no_kernel_id():
    assert kernel_id_of(None) is None


def test_a_plain_python_process_has_no_kernel_id():
    assert current_kernel_id() is None


def test_a_kernel_started_as_the_jupyter_server_starts_it_knows_its_id():
    manager = MultiKernelManager()
    kernel_id = manager.start_kernel(kernel_name="jupyter_mn")
    try:
        client = manager.get_kernel(kernel_id).client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        said: list[str] = []
        client.execute_interactive(
            "from jupyter_mn.model.kernelid import current_kernel_id; print(current_kernel_id())",
            timeout=60,
            output_hook=lambda msg: said.append(msg["content"].get("text", "")),
        )
        client.stop_channels()
    finally:
        manager.shutdown_kernel(kernel_id, now=True)
    assert "".join(said).strip() == kernel_id
