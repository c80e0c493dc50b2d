"""Abandoned turn ids: remembered for a while so that an Admit crossing the report is refused.

A dataplane reports ``TurnEvent.ABANDONED`` on its Connect stream when its client left while the
Admit was outstanding. That report and the Admit travel on different calls, so the Admit may arrive
after it (or be retried after it); the scheduler then refuses it at once instead of holding or
placing a turn nobody waits for. An id is remembered for 120 s after its report and at most
100,000 ids are kept (the oldest forgotten first), so a flood of reports cannot grow memory.

Reads: the time each abandoned id was reported (seconds of the shell's monotonic clock).
"""

from __future__ import annotations

TOMBSTONE_S = 120.0
MAX_TOMBSTONES = 100_000

ABANDONED_STATUS = 499
"""What the dataplane answers (nginx's "client closed request"); its client is gone anyway."""
ABANDONED_REASON = "turn was abandoned by its dataplane"


def tombstone_expired(reported_at: float, now: float) -> bool:
    """True when an id reported abandoned at ``reported_at`` may be forgotten."""
    return now - reported_at >= TOMBSTONE_S
