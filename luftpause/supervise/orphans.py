"""Worker processes that end, at once, with their parent.

granian serves each of our HTTP processes from a worker process it starts. When the main process
is killed outright (SIGKILL, the OOM killer), it cannot stop its worker, which would go on serving
on the port with nobody to supervise it, and a restart would find the port taken.
:func:`exit_with_parent`, called once in the worker, makes the worker follow its parent out at
once: a daemon thread waits on a pidfd of the parent (Linux 5.3+, :func:`os.pidfd_open`), which
becomes readable the moment the parent exits, and then ends the worker with ``os._exit``.

At once, not gracefully: the parent is gone, so is whoever would have stopped this worker, and
a graceful stop lets open streams run on (granian waits for them; the dataplane's worker streamed
for 5 s with no main process). Exiting closes every socket the worker holds: clients see their
streams broken (never a clean end), engines see their requests closed and stop generating, the
scheduler sees the dataplane's link end (and a dataplane restarted on the same address releases
what this one held), and the runtime's journal is left as a crash leaves it, which its replay
takes (its runs resume from their last completed tool round).

Where there is no pidfd (another OS, an old kernel), the thread polls ``os.getppid()`` every
:data:`POLL_SECONDS` instead: a worker re-parented (to init or a subreaper) has lost its parent.
Not ``prctl(PR_SET_PDEATHSIG)``: that fires when the *thread* that forked the worker ends, not the
process, and which thread granian forks from is granian's business.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time

log = logging.getLogger("luftpause.orphans")

POLL_SECONDS = 0.5
"""How often the fallback (no pidfd) looks whether the parent is still there (seconds)."""

EXIT_STATUS = 1
"""The worker's exit status when its parent died."""

_started: set[int] = set()


def _open_pidfd(pid: int) -> int | None:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:  # ENOSYS (old kernel), EPERM in some sandboxes, ESRCH: already gone
        return None
    return fd


def _exit_now(parent: int) -> None:
    log.error("parent process %d is gone: worker %d exits now", parent, os.getpid())
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


def exit_with_parent(poll_seconds: float = POLL_SECONDS) -> None:
    """Make this process exit at once when its parent process dies (see the module docstring).
    Idempotent per process; returns at once (the waiting is a daemon thread)."""
    pid = os.getpid()
    if pid in _started:
        return
    _started.add(pid)
    parent = os.getppid()
    fd = _open_pidfd(parent)
    if fd is not None and os.getppid() != parent:
        _exit_now(parent)  # it died between getppid and pidfd_open: the pidfd names someone else

    def wait_pidfd() -> None:
        assert fd is not None
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # readable once the process has exited
            pass
        _exit_now(parent)

    def poll_parent() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        _exit_now(parent)

    threading.Thread(
        target=wait_pidfd if fd is not None else poll_parent, name="exit-with-parent", daemon=True
    ).start()
