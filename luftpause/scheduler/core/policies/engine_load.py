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

* a probe that shows a queue (``waiting > 0``) sets it to the running count then; but while none
  is known, only a queue that shows the engine at its bound: one the probe before showed too, or
  one with the engine's KV cache full (``kv_usage`` at least :data:`KV_FULL`, or not reported, when
  nothing tells the two apart). A lone queue with KV to spare is the
  engine still admitting what it was just sent (SGLang takes a waiting request into its running
  batch one prefill chunk at a time): under a light load a probe catches such a queue now and then
  (8 of 60 probes with 6 agents per replica, SIMULATED), and taken as the bound it capped the
  replica at 1 to 6 turns while the engine had room, holding 23 % of batch turns for up to 6 s
  (bench/README.md "The policy across shapes"). Once known, a queue sets it (a lower count, by
  this rule, keeps more of the KV cache for the runs in progress under a flood at the KV bound),
  except that a queue with KV to spare never lowers it: SGLang admits a waiting request one
  prefill chunk at a time, so a probe under a flood often catches 5-7 of 8 running and one
  waiting, and taken as the bound that idled up to three slots (bench/README.md "KV-token
  admission"); the KV pool's bound is KV-token admission's (:mod:`.kv_admission`);
* a probe that shows the engine running *more* than it with no queue raises it to that count (the
  engine took more without queueing: more clients than ours, or a larger engine);
* a probe that shows the engine running exactly it, no queue, while held turns wait that the
  replica could take, raises it by one: so a larger engine (or one with freed KV cache) is found,
  one slot per probe (2 s), and a wrong guess costs at most one turn in the engine's queue, which
  the next probe sees and takes back;
* a probe that shows the engine running fewer than it, no queue, while no held turn waits that
  the replica could take, forgets it: the load fell off the engine's bound (a start's burst, a
  flood that ended), and with nothing held nothing rushes into the engine when the cap goes; a
  queue that comes back is learned again as above;
* an unhealthy probe (the engine may be restarting, with another configuration), or one that
  reports no load, forgets it.

While the batch capacity is known, the replica's effective capacity is the smaller of it and
``max_inflight``; unknown (no queue seen yet, or forgotten), ``max_inflight``. A replica that
reports no load (no metrics, or none under a known name) is capped only by ``max_inflight``.

Reads: the probe's health, ``running``, ``waiting`` (request counts, ``None`` when not reported) and
``kv_usage``; the replica's ``batch_capacity``, ``max_inflight``, whether its last probe showed a
queue (``Replica.queued``); whether held
turns wait that the replica could take (known to ``decide``, which keeps the queues).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


KV_FULL = 0.9
"""A KV cache this full (fraction of the pool in use) is the engine's bound: a queue then is one."""


@dataclass(frozen=True, slots=True)
class Learned:
    """What one probe leaves known: the batch capacity (requests, ``None``: not known) and whether the
    probe showed a queue."""

    capacity: int | None
    queued: bool = False


def learn(
    known: int | None,
    healthy: bool,
    running: int | None,
    waiting: int | None,
    turns_wait: bool,
    kv_usage: float | None = None,
    queued_before: bool = False,
) -> Learned:
    """The batch capacity after one probe, from the one ``known`` before it.

    ``running``, ``waiting`` and ``kv_usage`` are the engine's at the probe (``None``: not
    reported); ``turns_wait``: held turns wait that the replica could take; ``queued_before``: the
    replica's last probe showed a queue.
    """
    if not healthy or running is None or waiting is None:
        return Learned(None)
    if waiting > 0:
        spare = kv_usage is not None and kv_usage < KV_FULL
        if known is None and not queued_before and spare:
            return Learned(None, queued=True)  # a lone queue, KV to spare: it may still be admitting
        if known is not None and spare and running < known:
            return Learned(known, queued=True)  # admitting a prefill chunk at a time, not its bound
        return Learned(max(0, running), queued=True)
    if known is None:
        return Learned(None)
    if running > known:
        return Learned(running)
    if running == known and turns_wait:
        return Learned(known + 1)
    if running < known and not turns_wait:
        return Learned(None)  # room to spare and nothing held for it: the load fell off the bound
    return Learned(known)


def capacity(replica: Replica) -> int:
    """The most turns ``replica`` may have in flight now (its effective capacity, >= 0)."""
    learned = replica.batch_capacity
    if learned is None:
        return replica.max_inflight
    return min(replica.max_inflight, learned)
