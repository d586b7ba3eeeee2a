"""Cluster DNS for the test kubelet's pod processes: ``<hostname>.<subdomain>`` → pod IP.

The kubelet writes the table (``JUPYTER_MN_TEST_HOSTS``) as pods start; every lookup reads it
afresh, as a pod's resolver would ask CoreDNS. Other names resolve as usual.
"""

import json
import os
import socket

_lookup = socket.getaddrinfo


def _getaddrinfo(host, *args, **kwargs):
    table = os.environ.get("JUPYTER_MN_TEST_HOSTS")
    if table and isinstance(host, str):
        with open(table) as f:
            host = json.load(f).get(host, host)
    return _lookup(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
