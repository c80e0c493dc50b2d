"""luftpause between the agents and the engines: the real scheduler core, its shell modelled.

The core is imported, not copied: every turn is a ``TurnArrived`` fed to
:func:`luftpause.scheduler.core.decide`, and its actions are carried out as the shell
(:mod:`luftpause.scheduler.host`, :mod:`luftpause.scheduler.grpc_service`) carries them out:

* ``Place(turn, replica)``: the dataplane sends the turn to that replica's engine at once (the
  dataplane is modelled as instant), and the placement is the turn's ``TurnStarted``;
* when the engine's reply ends, the dataplane reports ``TurnFinished`` (with ``tool_calls`` when
  the reply asked for a tool, and the usage's token counts), preceded by the ``FirstToken`` it
  dates, stamped in the past as the shell stamps it (``at - first_token_ago_s``);
* an agent's ``DELETE /v1/runs/{id}`` is ``RunEnded``;
* the probe loop (:mod:`luftpause.scheduler.probes`) every ``PROBE_INTERVAL_S`` (2 s) feeds one
  ``ReplicasProbed`` round with each engine model's ``load()`` as its ``/metrics`` give it (running
  and waiting requests, token usage, cache hit rate), so engine-load admission reads what it reads
  on a real stack; the 1 s clock tick is a ``Tick``. Probes fall on even seconds, ticks half a
  second after each second, so that the two never share an instant.

Capacity leases (``[scheduler] leases``) are off: with an instant dataplane a lease only saves a
round trip that costs nothing here, and the placements are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from luftpause.scheduler.core import (
    Action,
    Event,
    FirstToken,
    Place,
    Reject,
    ReplicaProbed,
    ReplicasProbed,
    RunEnded,
    Tick,
    TurnArrived,
    TurnFinished,
    TurnStarted,
    decide,
    state_from_replicas,
)
from luftpause.testkit.sim.arrangements import Arrangement
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import EnginePool, Usage
from luftpause.testkit.sim.workload import Run, Turn

MODEL = "llama-3.2-1b"
PROBE_INTERVAL_S = 2.0
TICK_INTERVAL_S = 1.0
DATAPLANE = "sim-dataplane"


@dataclass(frozen=True, slots=True)
class _ReplicaSpec:
    """A configured replica as the core reads it (``luftpause.config.ReplicaConfig``'s shape)."""

    name: str
    models: tuple[str, ...]
    kind: Literal["generative", "single_pass"]
    max_inflight: int
    kv_tokens: int | None = None


class Luftpause(Arrangement):
    """The scheduler core over ``pool``; ``strict_affinity`` as ``[scheduler] strict_affinity``,
    ``max_inflight`` as each replica's (default 32, so engine-load admission caps them), and each
    replica's ``kv_tokens`` its engine's KV pool (SGLang's ``max_total_num_tokens``, as an operator
    configures it from the engine's ``/server_info``);
    ``policy``: further keywords of :func:`~luftpause.scheduler.core.state_from_replicas` (the
    headroom and ordering policies' settings)."""

    def __init__(
        self,
        clock: VirtualClock,
        pool: EnginePool,
        strict_affinity: bool = True,
        max_inflight: int = 32,
        name: str | None = None,
        policy: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(clock, pool)
        self.name = name or ("luftpause" if strict_affinity else "luftpause-moving")
        specs = [
            _ReplicaSpec(replica, (MODEL,), "generative", max_inflight, engine.profile.pool_tokens)
            for replica, engine in zip(pool.names, pool.engines, strict=True)
        ]
        self.state = state_from_replicas(
            specs, strict_affinity=strict_affinity, resync_hold_s=0.0, **dict(policy or {})
        )
        self._index = {replica: index for index, replica in enumerate(pool.names)}
        self._turns: dict[str, Turn] = {}
        self._arrived_at: dict[str, float] = {}
        self.held_seconds: dict[str, list[float]] = {"interactive": [], "batch": []}
        self.events = 0

    def start(self) -> None:
        self.clock.every(PROBE_INTERVAL_S, self._probe, first=self.clock.now)
        self.clock.every(TICK_INTERVAL_S, self._tick, first=self.clock.now + TICK_INTERVAL_S / 2)

    def send(self, turn: Turn, now: float) -> None:
        self._turns[turn.turn_id] = turn
        self._arrived_at[turn.turn_id] = now
        run = turn.run
        self._feed(
            TurnArrived(turn.turn_id, run.run_id, MODEL, run.service_class, run.caller, DATAPLANE, now)
        )

    def end_run(self, run: Run, now: float) -> None:
        self._feed(RunEnded(run.run_id, now))

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None:
        if turn.first_token_at is not None:
            self._feed(FirstToken(turn.turn_id, turn.first_token_at))
        self._feed(
            TurnFinished(
                turn.turn_id,
                now,
                "tool_calls" if turn.tool_call_seen else "stop",
                turn.tool_call_seen,
                usage.prompt_tokens,
                usage.completion_tokens,
            )
        )
        self._turns.pop(turn.turn_id, None)
        super().finished(turn, replica, usage, now)

    def counters(self) -> dict[str, int]:
        c = self.state.counters
        return {
            "admitted": c.admitted,
            "finished": c.finished,
            "expiredRuns": c.expired_runs,
            "events": self.events,
        }

    def _probe(self) -> None:
        now = self.clock.now
        probes = []
        for index, replica in enumerate(self.pool.names):
            load = self.pool.probe(index)
            probes.append(
                ReplicaProbed(
                    replica, now, True, load.running, load.waiting, load.kv_usage, load.cache_hit_rate
                )
            )
        self._feed(ReplicasProbed(now, tuple(probes)))

    def _tick(self) -> None:
        self._feed(Tick(self.clock.now))

    def _feed(self, event: Event) -> None:
        self.events += 1
        self.state, actions = decide(self.state, event)
        self._carry_out(actions)

    def _carry_out(self, actions: list[Action]) -> None:
        now = self.clock.now
        for action in actions:
            if isinstance(action, Place):
                turn = self._turns[action.turn_id]
                arrived = self._arrived_at.pop(action.turn_id, now)
                self.held_seconds[turn.run.service_class].append(now - arrived)
                self.pool.submit(self._index[action.replica], turn, self)
                self._feed(TurnStarted(action.turn_id, now))
            elif isinstance(action, Reject):  # pragma: no cover - every turn's model is served
                raise RuntimeError(f"the core refused {action.turn_id}: {action.reason}")
