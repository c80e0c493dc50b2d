"""Worker processes that end with their parent.

granian serves each of our HTTP processes from a worker process it starts. When the main process
is killed outright (SIGKILL, the OOM killer), it cannot stop its worker, which would go on serving
on the port with nobody to supervise it, and a restart would find the port taken.
:func:`exit_with_parent`, called once in the worker, makes the worker follow its parent out:

* a daemon thread polls ``os.getppid()`` every :data:`POLL_SECONDS`; once the worker has been
  re-parented (to init or a subreaper), its parent is gone;
* it then sends the worker ``SIGTERM`` (a graceful stop: the lifespan's shutdown runs, the
  journal is closed), and if the worker is still there :data:`GRACE_SECONDS` later, ends it with
  ``os._exit(1)``.

Polling rather than Linux's ``prctl(PR_SET_PDEATHSIG)``: that signal fires when the *thread* that
forked the worker ends, not the process, and portably knowing which thread granian forks from is
not possible; it is also Linux-only. Half a second of polling costs nothing measurable.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("luftpause.orphans")

POLL_SECONDS = 0.5
"""How often the worker looks whether its parent is still there (seconds)."""

GRACE_SECONDS = 5.0
"""How long a graceful stop may take after the parent is gone before the worker exits at once
(seconds)."""

_started: set[int] = set()


def exit_with_parent(poll_seconds: float = POLL_SECONDS, grace_seconds: float = GRACE_SECONDS) -> None:
    """Make this process stop when its parent process dies (see the module docstring). Idempotent
    per process; returns at once (the watching is a daemon thread)."""
    pid = os.getpid()
    if pid in _started:
        return
    _started.add(pid)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        log.warning("parent process %d is gone: stopping worker %d", parent, pid)
        os.kill(pid, signal.SIGTERM)
        time.sleep(grace_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
