"""The run network's change counter, and the wake-up of everyone waiting for a change.

One :class:`NetworkChanges` per runtime, shared by the run registry and the parts that keep state
beside it (scopes, notifications, tree depths: :mod:`luftpause.runtime.pods`), so each of them can
say "the network changed" without holding the registry. Readers:

* the monitor answers "unchanged" while :attr:`NetworkChanges.version` stands
  (:mod:`luftpause.runtime.web.monitor`);
* waiters (``await``, a task's watcher) wait on :attr:`NetworkChanges.event`, which
  :meth:`NetworkChanges.notify` sets and replaces: a waiter takes the current event, re-checks,
  then waits on it, so a change between its check and its wait is never missed
  (:mod:`luftpause.runtime.runs.waiting`).
"""

from __future__ import annotations

import asyncio


class NetworkChanges:
    """A version counter and the event the next notification sets (see the module docstring)."""

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        """Count a change that nobody needs to be woken for (the monitor still sees it)."""
        self.version += 1

    def notify(self) -> None:
        """Count a change and wake every waiter to look again."""
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    @property
    def event(self) -> asyncio.Event:
        """The event the next :meth:`notify` sets."""
        return self._event
