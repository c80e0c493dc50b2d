"""Engine-load admission: how many turns a replica may have in flight, from what its engine reports.

docs/architecture.md "Engine-load admission": "while a replica's /metrics report no waiting queue,
it accepts turns. Once a queue forms, luftpause caps in-flight turns at the engine's running count
and holds the rest itself."

Read literally, probe by probe, that flips: a probe that sees a queue caps the replica at the
engine's running count (say 4); the queue drains, the next probe sees none, and the cap is gone,
so every held turn is placed at once (up to ``max_inflight``, 32 by default) and waits inside the
engine's FIFO queue, where service class and caller no longer count. So the running count seen
while a queue existed is remembered as what it is, the engine's *batch capacity*
(``Replica.batch_capacity``), one per replica, learned from its probes (:func:`learn`):

* a probe that shows a queue (``waiting > 0``) sets it to the running count then;
* a probe that shows the engine running *more* than it with no queue raises it to that count (the
  engine took more without queueing: more clients than ours, or a larger engine);
* a probe that shows the engine running exactly it, no queue, while held turns wait that the
  replica could take, raises it by one: so a larger engine (or one with freed KV cache) is found,
  one slot per probe (2 s), and a wrong guess costs at most one turn in the engine's queue, which
  the next probe sees and takes back;
* an unhealthy probe (the engine may be restarting, with another configuration), or one that
  reports no load, forgets it.

While the batch capacity is known, the replica's effective capacity is the smaller of it and
``max_inflight``; unknown (no queue seen yet, or forgotten), ``max_inflight``. A replica that
reports no load (no metrics, or none under a known name) is capped only by ``max_inflight``.

Reads: the probe's health, ``running`` and ``waiting`` (request counts, ``None`` when not
reported); the replica's ``batch_capacity`` and ``max_inflight``; whether held turns wait that
the replica could take (known to ``decide``, which keeps the queues).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def learn(
    known: int | None, healthy: bool, running: int | None, waiting: int | None, turns_wait: bool
) -> int | None:
    """The batch capacity (requests) after one probe, from the one ``known`` before it.

    ``running`` and ``waiting`` are the engine's counts at the probe (``None``: not reported);
    ``turns_wait``: held turns wait that the replica could take. ``None``: not known.
    """
    if not healthy or running is None or waiting is None:
        return None
    if waiting > 0:
        return max(0, running)
    if known is None:
        return None
    if running > known:
        return running
    if running == known and turns_wait:
        return known + 1
    return known


def capacity(replica: Replica) -> int:
    """The most turns ``replica`` may have in flight now (its effective capacity, >= 0)."""
    learned = replica.batch_capacity
    if learned is None:
        return replica.max_inflight
    return min(replica.max_inflight, learned)
