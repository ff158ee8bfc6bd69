"""``launcher.ports.free_ports``: the ports of one stack are distinct (picked one by one, each released before the
next, the OS may hand the same port out twice: a stack's worker then listened on the port chosen for its
scheduler, which refused to start, CI of 2026-12-02)."""

from __future__ import annotations

import socket

from launcher import ports


def test_the_ports_picked_for_a_stack_are_distinct_even_when_the_os_repeats_itself(monkeypatch) -> None:
    real_socket = socket.socket
    handed = iter([41001, 41001, 41001, 41002, 41003, 41004])  # what a bind to port 0 would answer, in turn

    class RepeatingSocket:
        """A socket whose bind to port 0 gets the next port of ``handed`` unless that one is bound now."""

        bound: set[int] = set()

        def __init__(self, *args) -> None:
            self.port = None

        def bind(self, address) -> None:
            port = next(handed)
            while port in RepeatingSocket.bound:  # the kernel never gives a bound port twice
                port = next(handed)
            self.port = port
            RepeatingSocket.bound.add(port)

        def getsockname(self):
            return ("127.0.0.1", self.port)

        def close(self) -> None:
            RepeatingSocket.bound.discard(self.port)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.close()

    monkeypatch.setattr(ports.socket, "socket", RepeatingSocket)
    picked = ports.free_ports(4)
    monkeypatch.setattr(ports.socket, "socket", real_socket)
    assert len(set(picked)) == 4, picked


def test_free_ports_are_bindable() -> None:
    for port in ports.free_ports(3):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
