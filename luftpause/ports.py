"""Is a listen address free? Checked before serving, because granian binds with SO_REUSEPORT.

With SO_REUSEPORT a second dataplane or runtime on a taken port starts without error and the kernel
splits connections between the two processes, so MCP sessions and runs would be split too. A plain
bind (SO_REUSEADDR only, which passes TIME_WAIT leftovers) fails on a port anyone listens on.
"""

from __future__ import annotations

import argparse
import errno
import socket

from luftpause.config import split_host_port


def address_in_use(address: str) -> bool:
    """True when ``host:port`` cannot be bound because something already holds it."""
    host, port = split_host_port(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise  # not ours to bind at all (EADDRNOTAVAIL, EACCES): say so as it is
    return False


def refuse_if_in_use(command: str, address: str) -> None:
    """Exit with status 1 and a message when ``address`` is taken or cannot be bound here."""
    try:
        taken = address_in_use(address)
    except OSError as exc:
        raise SystemExit(f"luftpause {command}: cannot listen on {address}: {exc.strerror}") from None
    if taken:
        raise SystemExit(f"luftpause {command}: {address} is already in use; stop what listens there first")


def port_number(text: str) -> int:
    """An ``argparse`` type for a TCP port to listen on: an integer from 1 to 65535.

    Raises ``argparse.ArgumentTypeError`` otherwise (0 would bind a random port unannounced, and
    beyond 65535 the socket layer raises ``OverflowError``).
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 1 to 65535, not {port}")
    return port
