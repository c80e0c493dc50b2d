"""The test kit's ``free_port``: never the same port twice to one test run (real sockets)."""

from __future__ import annotations

import socket

from luftpause.testkit.launch.procs import free_port


def test_free_port_never_hands_out_a_port_twice_in_a_row_of_thousands() -> None:
    # The kernel picks among about 14,000 ports: 3,000 random picks repeat one almost surely
    # (a birthday collision), which is what put two servers of one stack on the same port.
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)


def test_a_port_handed_out_is_free_to_bind() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
