"""Rank 0's store port: chosen below the ephemeral range, never one in use."""

from __future__ import annotations

import socket

import pytest

from jupyter_mn.node import ports


def _listening(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_the_port_is_below_the_ephemeral_range_and_can_be_listened_on():
    start = ports.ephemeral_start()
    for _ in range(20):
        port = ports.listen_port("127.0.0.1")
        assert ports._LOWEST <= port < start
        _listening(port).close()


def test_a_port_in_use_is_never_chosen(monkeypatch):
    taken = _listening(0)  # wherever the OS put it, make it and the next one the only candidates
    port = taken.getsockname()[1]
    monkeypatch.setattr(ports, "_LOWEST", port)
    monkeypatch.setattr(ports, "ephemeral_start", lambda: port + 2)
    with taken:
        if not ports.is_free("127.0.0.1", port + 1):
            pytest.skip(f"port {port + 1} is busy on this machine")
        assert {ports.listen_port("127.0.0.1") for _ in range(10)} == {port + 1}


def test_without_room_below_the_range_the_os_assigns_one(monkeypatch):
    start = ports.ephemeral_start()
    monkeypatch.setattr(ports, "ephemeral_start", lambda: ports._LOWEST)
    port = ports.listen_port("127.0.0.1")
    assert port >= start
    _listening(port).close()
