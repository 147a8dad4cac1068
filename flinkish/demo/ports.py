"""Loopback ports for the servers the demo and the tests start (brokers, PostgreSQL, proxies).

They come from outside the kernel's ephemeral range: a client still calling a stopped server's
port (a librdkafka consumer in a Python worker's pool) could otherwise reach a listener Spark
opened there on port 0 for a single peer, such as a ``transformWithState`` task's state server,
and stall its query. Outside the range, only another server of ours can get that port.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

#: Linux's default ephemeral range, when /proc does not say
_DEFAULT_EPHEMERAL = (32768, 60999)
#: the lowest port handed out (below it sit most well-known services' ports)
_LOWEST = 10000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range, inclusive."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def _candidates(attempts: int) -> Iterator[int]:
    low, high = ephemeral_range()
    spans = [(a, b) for a, b in ((_LOWEST, low - 1), (high + 1, 65535)) if a <= b]
    weights = [b - a + 1 for a, b in spans]
    for _ in range(attempts if spans else 0):
        a, b = random.choices(spans, weights)[0]
        yield random.randint(a, b)


def server_socket(attempts: int = 200) -> socket.socket:
    """A listening loopback TCP socket on a port outside the ephemeral range, picked at random
    (so servers started one after another rarely reuse a port a stale client still calls);
    on an ephemeral port if the range leaves no room."""
    for port in _candidates(attempts):
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            continue
    return socket.create_server(("127.0.0.1", 0))


def free_port(attempts: int = 200) -> int:
    """A loopback TCP port nothing listens on now, outside the ephemeral range, for a server
    of another process to listen on (see :func:`server_socket`)."""
    with server_socket(attempts) as probe:
        port: int = probe.getsockname()[1]
        return port
