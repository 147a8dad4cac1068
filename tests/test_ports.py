"""The demo's and the tests' servers listen outside the kernel's ephemeral port range, where no
``bind(port 0)`` of Spark's (a transformWithState task's state server, a Python worker's
callback) can be given a port a stale client of a stopped server still calls."""

from __future__ import annotations

import socket

from flinkish.demo.ports import ephemeral_range, free_port, server_socket


def _outside(port: int) -> bool:
    low, high = ephemeral_range()
    return not low <= port <= high


def test_free_ports_and_server_sockets_are_outside_the_ephemeral_range() -> None:
    with socket.socket() as ephemeral:
        ephemeral.bind(("127.0.0.1", 0))
        assert not _outside(ephemeral.getsockname()[1])  # the range read is the kernel's
    ports = {free_port() for _ in range(20)}
    assert all(_outside(p) and p >= 1024 for p in ports)
    assert len(ports) > 10  # picked at random: servers in turn rarely share a port
    with server_socket() as server:
        port = server.getsockname()[1]
        assert _outside(port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it listens
        assert free_port() != port
