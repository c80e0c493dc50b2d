"""SGLang Model Gateway (PyPI ``smg`` 1.13) at its best for this load: sticky by run id, its
priority-aware admission scheduler with the two callers as classes.

Configured as ``bench/pools.py`` starts it (``python -m smg launch``): ``--policy cache_aware
--sticky-sessions --routing-key-headers x-luftpause-run-id --priority-scheduler-enabled
--priority-scheduler-config <yaml>``, with the interactive agents sending ``x-smg-priority:
interactive`` and the batch agents ``x-smg-priority: bulk``, and the YAML's tenant policy letting
the default tenant ask for ``interactive`` (``--priority-scheduler-default-max-class interactive``).
What that does, from its source (lightseekorg/smg, ``model_gateway/src/middleware/scheduler/`` and
``policies/``):

* **Routing**: a request with a routing key goes to the worker its key is pinned to (the sticky
  map, ``policies/manual.rs``; remapped only if that worker turns unhealthy); a new key is routed
  by the underlying policy, then pinned (assignment mode ``delegate``). ``cache_aware`` over HTTP is
  the approximate string tree of SGLang's router (:mod:`.router`): a run's first turn matches
  nothing of another run's text and goes to the worker with the smallest tree.
* **Admission**: one slot pool for the whole gateway (``slots.rs``). Its capacity is the sum of the
  workers' ``max_running_requests`` (their ``/server_info``; ``worker/capacity.rs``, tier 2), so
  the gateway admits as many turns as the engines have running slots. Each class reserves
  ``max(reserved_floor, ceil(reserved_per_slot x capacity))`` slots; a class may not take the
  reserved-and-unused slots of a higher class (``slots_available_to``). A turn that finds no slot
  waits in its class's FIFO queue (``queue.rs``, ``queue_size`` deep, else 429) for at most
  ``queue_timeout_secs`` (then 408). When a slot frees (the permit is held for the whole streamed
  response) the dispatcher (``engine.rs`` ``wake_next_waiter``) first admits the head of the lowest
  class whose head has waited past its ``starvation_threshold_secs`` (ignoring reservations), else
  the head of the highest class with a slot available to it.
* **Preemption** (``can_preempt``, on for interactive by default): an arriving higher-class turn
  that finds no slot cancels a lower-class turn admitted but not yet streaming (503 to its
  client). Off here by default (:attr:`GatewaySettings.preempt`): a preempted turn fails its agent's
  whole run, which costs batch more than it gives interactive; ``preempt=True`` models it.

A 408 or 429 fails the turn; the agent backs off as the HTTP agents do.

Defaults of the YAML written by ``bench/pools.py`` (:class:`GatewaySettings`): the built-in
class defaults (``config.rs`` ``default_for``) except the reservation floors, which are sized for
this pool rather than a cluster (the built-in interactive floor of 128 and system floor of 32
exceed a 16-slot pool, and the gateway then refuses to start its scheduler and falls back to its
legacy limiter): interactive reserves one slot per interactive agent, system none.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from luftpause.testkit.sim.arrangements import Arrangement
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import EnginePool, Usage
from luftpause.testkit.sim.router import CacheAwareRouter
from luftpause.testkit.sim.workload import Agents, Run, Turn

if TYPE_CHECKING:
    from luftpause.testkit.sim.replay import Replay

CLASSES = ("bulk", "default", "interactive", "system")
"""SMG's classes in ascending priority (``class.rs``: ``Bulk = 0`` .. ``System = 3``)."""


@dataclass(frozen=True, slots=True)
class ClassSettings:
    """One class's YAML entry (``ClassConfig``)."""

    reserved_floor: int
    reserved_per_slot: float
    queue_size: int
    queue_timeout_secs: float
    starvation_threshold_secs: float


DEFAULT_CLASSES = {
    "system": ClassSettings(0, 0.0, 64, 30, 5),
    "interactive": ClassSettings(0, 0.25, 256, 30, 5),
    "default": ClassSettings(0, 0.10, 512, 60, 30),
    "bulk": ClassSettings(0, 0.0, 1024, 300, 120),
}
"""The built-in defaults (``ClassConfig::default_for``), floors set to 0 (see the module doc)."""


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """How the gateway is configured. ``interactive_floor``: the interactive class's
    ``reserved_floor`` (``None``: one per interactive agent); ``capacity``: the slot pool's size
    (``None``: the engines' running slots summed, as the workers report)."""

    interactive_floor: int | None = None
    capacity: int | None = None
    preempt: bool = False
    sticky: bool = True


class Gateway(Arrangement):
    """SGLang Model Gateway in front of ``pool``, ``slots`` running slots per engine."""

    name = "smg"

    def __init__(
        self, clock: VirtualClock, pool: EnginePool, slots: int, settings: GatewaySettings | None = None
    ) -> None:
        """``slots``: each engine's ``max_running_requests`` as its ``/server_info`` reports it."""
        super().__init__(clock, pool)
        self.settings = settings or GatewaySettings()
        self.router = CacheAwareRouter(len(pool))
        self.sticky: dict[str, int] = {}
        self.capacity = self.settings.capacity or slots * len(pool)
        self.inflight = {c: 0 for c in CLASSES}
        self.queues: dict[str, deque[tuple[float, Turn]]] = {c: deque() for c in CLASSES}
        self.reserved = {c: 0 for c in CLASSES}
        self.admitted: dict[str, str] = {}  # turn id -> class, while it holds a slot
        self.streaming: set[str] = set()
        self.rejected = {"queue_full": 0, "queue_timeout": 0, "preempted": 0}
        self.starvation_promotions = 0

    def attach(self, agents: Agents | Replay) -> None:
        super().attach(agents)
        interactive_agents = sum(g.agents for g in agents.shape.groups if g.service_class == "interactive")
        floor = self.settings.interactive_floor
        classes = dict(DEFAULT_CLASSES)
        base = classes["interactive"]
        classes["interactive"] = ClassSettings(
            interactive_agents if floor is None else floor,
            base.reserved_per_slot,
            base.queue_size,
            base.queue_timeout_secs,
            base.starvation_threshold_secs,
        )
        self.classes = classes
        desired = {
            c: min(
                self.capacity,
                max(classes[c].reserved_floor, math.ceil(classes[c].reserved_per_slot * self.capacity)),
            )
            for c in CLASSES
        }
        remaining = self.capacity
        for c in reversed(CLASSES):  # the priority-ordered clamp: system first
            self.reserved[c] = min(desired[c], remaining)
            remaining -= self.reserved[c]

    def start(self) -> None:
        # the dispatcher's periodic tick (the smallest starvation threshold), for the override
        interval = min(s.starvation_threshold_secs for s in self.classes.values())
        self.clock.every(interval, self._dispatch)
        self.clock.every(1.0, self._expire_waiters)

    @staticmethod
    def _class_of(turn: Turn) -> str:
        return "interactive" if turn.run.service_class == "interactive" else "bulk"

    def _available(self, cls: str, ignore_reservations: bool = False) -> int:
        used = sum(self.inflight.values())
        free = self.capacity - used
        if ignore_reservations:
            return max(0, free)
        rank = CLASSES.index(cls)
        held_back = sum(max(0, self.reserved[c] - self.inflight[c]) for c in CLASSES[rank + 1 :])
        return max(0, free - held_back)

    def send(self, turn: Turn, now: float) -> None:
        cls = self._class_of(turn)
        if self._available(cls) > 0:
            self._admit(turn, cls)
            return
        if self.settings.preempt and cls == "interactive" and self._preempt(cls):
            self._admit(turn, cls)
            return
        if len(self.queues[cls]) >= self.classes[cls].queue_size:
            self.rejected["queue_full"] += 1
            self._fail(turn, "HTTP 429: queue full")
            return
        self.queues[cls].append((now, turn))

    def _admit(self, turn: Turn, cls: str) -> None:
        self.inflight[cls] += 1
        self.admitted[turn.turn_id] = cls
        self.pool.submit(self._route(turn), turn, self)

    def _route(self, turn: Turn) -> int:
        run_id = turn.run.run_id
        if self.settings.sticky:
            pinned = self.sticky.get(run_id)
            if pinned is not None:
                self.router.load[pinned] += 1
                self.router.tree.insert(turn.prompt, pinned)
                return pinned
        worker = self.router.route(turn.prompt)
        self.sticky[run_id] = worker
        return worker

    def _preempt(self, cls: str) -> bool:
        rank = CLASSES.index(cls)
        victims = [
            turn_id
            for turn_id, c in self.admitted.items()
            if CLASSES.index(c) < rank and turn_id not in self.streaming
        ]
        if not victims:
            return False
        victim = victims[-1]  # the newest admitted of the lowest class (max_by_key admitted_at)
        victim_cls = self.admitted.pop(victim)
        self.inflight[victim_cls] -= 1
        self.rejected["preempted"] += 1
        cancelled = self.pool.cancel(victim)
        if cancelled is not None:
            turn, replica = cancelled
            self.router.done(replica)
            self._fail(turn, "HTTP 503: preempted")
        return True

    def first_token(self, turn: Turn, replica: int, now: float) -> None:
        self.streaming.add(turn.turn_id)

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None:
        self.router.done(replica)
        self.streaming.discard(turn.turn_id)
        cls = self.admitted.pop(turn.turn_id)
        self.inflight[cls] -= 1
        super().finished(turn, replica, usage, now)
        self._dispatch()

    def end_run(self, run: Run, now: float) -> None:
        self.sticky.pop(run.run_id, None)  # an idle key would be evicted after 4 h; never reused here

    def _dispatch(self) -> None:
        while self._wake_next():
            pass

    def _wake_next(self) -> bool:
        now = self.clock.now
        for cls in ("bulk", "default", "interactive"):
            queue = self.queues[cls]
            if queue and now - queue[0][0] > self.classes[cls].starvation_threshold_secs:
                if self._available(cls, ignore_reservations=True) > 0:
                    self.starvation_promotions += 1
                    self._admit(queue.popleft()[1], cls)
                    return True
        for cls in reversed(CLASSES):
            queue = self.queues[cls]
            if queue and self._available(cls) > 0:
                self._admit(queue.popleft()[1], cls)
                return True
        return False

    def _expire_waiters(self) -> None:
        now = self.clock.now
        for cls, queue in self.queues.items():
            timeout = self.classes[cls].queue_timeout_secs
            while queue and now - queue[0][0] >= timeout:
                _, turn = queue.popleft()
                self.rejected["queue_timeout"] += 1
                self._fail(turn, "HTTP 408: queue timeout")

    def _fail(self, turn: Turn, error: str) -> None:
        assert self.agents is not None
        self.agents.failed(turn, error)

    def counters(self) -> dict[str, int]:
        return {
            **self.rejected,
            "starvationPromotions": self.starvation_promotions,
            "capacity": self.capacity,
        }
