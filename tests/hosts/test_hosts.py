"""The test hosts themselves (``hosts.py``): what a process started on one sees."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.hosts import HostNet, missing

pytestmark = pytest.mark.system

LOOKUP = """
import socket, sys
print(socket.gethostname())
print(open("/etc/resolv.conf").read().strip())
try:
    socket.getaddrinfo(sys.argv[1], None)
    print("resolved")
except OSError:
    print("resolves to nothing")
"""


def test_a_host_has_its_name_and_its_own_resolver_and_leaves_no_files():
    if missing() is not None:
        pytest.skip(missing())
    with HostNet.create(2) as net:
        host, other = net.hosts
        argv = host.command([sys.executable, "-c", LOOKUP, other.hostname])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        # the machine's nameserver is out of reach: lookups go to the host's loopback instead
        assert done.stdout.splitlines() == [
            host.hostname,
            "nameserver 127.0.0.1",
            "resolves to nothing",
        ]
        made = [h.resolv_conf.parent for h in net.hosts]
    assert not any(folder.exists() for folder in made)
