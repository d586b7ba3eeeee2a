"""The kernel's inbox: what another thread puts wakes the thread waiting on it, also while that
thread sits reading the watched sockets (the cell streams); replies are never dropped."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator

import pytest

from jupyter_mn.gang import inbox as inbox_module
from jupyter_mn.gang.inbox import Inbox, Reply
from tests.support.polling import wait_until


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def watched(inbox: Inbox, sock: socket.socket) -> list[bytes]:
    """Watch ``sock``: what it reads becomes a reply (node 0) and is recorded."""
    seen: list[bytes] = []

    def readable() -> None:
        data = sock.recv(1024)
        seen.append(data)
        inbox.put_reply(Reply(0, value=data))

    inbox.watch(sock, readable)
    return seen


def waiting(inbox: Inbox) -> tuple[threading.Thread, list[object]]:
    """A thread waiting on ``inbox`` for a minute: it ends far sooner only when woken."""
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(inbox.get(timeout=60)), daemon=True)
    thread.start()
    return thread, got


def reading(inbox: Inbox) -> None:
    """Until a thread sits reading the inbox's sockets (so a put must wake it there)."""
    wait_until(lambda: inbox._reader, timeout=10, what="a thread reading the sockets")


@pytest.mark.parametrize("sockets", [0, 1])
def test_a_put_from_another_thread_wakes_the_waiting_one(pair, sockets):
    inbox = Inbox()
    if sockets:  # the waiting thread sits in the selector, not on the condition
        watched(inbox, pair[0])
    waiter, got = waiting(inbox)
    if sockets:
        reading(inbox)
    inbox.put_reply(Reply(3))
    waiter.join(10)
    assert got == [Reply(3)]
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.05)


def test_a_watched_socket_is_read_by_the_getter_even_with_no_time_to_wait(pair):
    inbox = Inbox()
    seen = watched(inbox, pair[0])
    pair[1].sendall(b"reply")
    assert inbox.get(timeout=0) == Reply(0, value=b"reply")
    assert seen == [b"reply"]
    with pytest.raises(queue.Empty):  # read once: nothing more
        inbox.get(timeout=0)


def test_a_socket_watched_while_a_thread_waits_is_read_by_it(pair):
    inbox = Inbox()
    waiter, got = waiting(inbox)  # no socket yet: it waits for puts
    watched(inbox, pair[0])
    pair[1].sendall(b"reply")
    waiter.join(10)
    assert got == [Reply(0, value=b"reply")]


def test_the_last_socket_unwatched_under_a_waiter_leaves_it_waiting_for_puts(pair):
    inbox = Inbox()
    watched(inbox, pair[0])
    waiter, got = waiting(inbox)
    inbox.unwatch(pair[0])  # the stream closed (teardown) while a job waited
    inbox.put_reply(Reply(1))
    waiter.join(10)
    assert got == [Reply(1)]
    pair[1].sendall(b"late")  # no longer read
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.05)


def test_the_last_socket_unwatched_after_a_put_is_closed_by_its_reader_not_under_it(pair):
    inbox = Inbox()
    watched(inbox, pair[0])
    sockets = inbox._sockets
    waiter, got = waiting(inbox)
    reading(inbox)
    inbox.put_event("event")  # wakes the reader...
    inbox.unwatch(pair[0])  # ...which closes the selector once out of it, not while in it
    waiter.join(10)
    assert got == ["event"]
    assert sockets is not None and sockets.closed


def test_events_beyond_the_backlog_drop_the_oldest_event_never_a_reply(monkeypatch):
    monkeypatch.setattr(inbox_module, "_BACKLOG", 3)
    inbox = Inbox()
    inbox.put_event("e1")
    inbox.put_reply(Reply(0))
    for event in ("e2", "e3", "e4"):
        inbox.put_event(event)
    assert inbox.dropped == 1
    assert [inbox.get(timeout=0) for _ in range(4)] == [Reply(0), "e2", "e3", "e4"]
    assert inbox.is_event("e2") and not inbox.is_event(Reply(0))
