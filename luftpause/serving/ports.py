"""Is a listen address free? Checked before serving, because granian binds with SO_REUSEPORT.

With SO_REUSEPORT a second dataplane or runtime on a taken port starts without error and the kernel
splits connections between the two processes, so MCP sessions and runs would be split too. A plain
bind (SO_REUSEADDR only, which passes TIME_WAIT leftovers) fails on a port anyone listens on.

The check alone leaves a window: two processes started at once both find the port free, then both
bind it. :func:`hold_listen_lock` closes it: an exclusive ``flock`` on a file named after the
address, taken before the check and held for the process's life. The kernel drops the lock with
the last process holding it (a crash included), so a restart on the same address after its
predecessor died takes it at once.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import re
import socket
import tempfile
import time

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


_HELD_LOCKS: list[int] = []
"""File descriptors of the locks this process holds: open until it exits."""


def listen_lock_path(command: str, address: str) -> str:
    """The lock file of ``command`` listening on ``address``, in the system's temp directory."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", address)
    return os.path.join(tempfile.gettempdir(), f"luftpause-{command}-{safe}.lock")


def hold_listen_lock(command: str, address: str) -> None:
    """Take the exclusive lock of ``command`` on ``address`` for this process's life.

    Exits with status 1 and a message naming the holder's pid when another process holds it (a
    second ``luftpause dataplane`` on the same address would bind beside the first with
    SO_REUSEPORT and serve under the same dataplane id). Inherited by granian's workers.
    """
    path = listen_lock_path(command, address)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SystemExit(
            f"luftpause {command}: {address} is already in use by another luftpause {command} "
            f"(pid {holder}, lock {path})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD_LOCKS.append(fd)


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


WORKER_SLOT_WAIT_S = 10.0
"""How long a worker waits for a slot while every one is held (a worker starting before the one it
replaces has gone); then it serves under a dataplane id of its own process."""


def hold_worker_slot(
    command: str, address: str, workers: int, wait_s: float = WORKER_SLOT_WAIT_S
) -> int | None:
    """Take the first free of ``workers`` slot locks of ``command`` on ``address`` for this
    process's life: the worker's number (0 to ``workers - 1``), or ``None`` when none freed within
    ``wait_s`` seconds.

    A worker's dataplane id is built from its number, so it must be distinct among the living
    workers and the same for a worker that replaces a dead one (its resync then releases what the
    dead one held). granian passes its worker index to no loader, so the workers take numbers
    here: an exclusive ``flock`` on one file per number, dropped by the kernel when its worker
    dies (as :func:`hold_listen_lock`'s).
    """
    deadline = time.monotonic() + wait_s
    while True:
        for slot in range(workers):
            path = listen_lock_path(f"{command}-worker-{slot}", address)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _HELD_LOCKS.append(fd)
            return slot
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
