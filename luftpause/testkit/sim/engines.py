"""The engine replicas of a simulated pool: engine models (:mod:`luftpause.testkit.engine.model`)
driven on the virtual clock.

Each replica is one sans-IO engine model. The pool submits a turn to it as an ``EngineRequest``
(prompt nodes, reply length, the reply's node to cache, a priority), keeps one :class:`Timer` per
replica armed at the model's ``next_event_time()``, and when it fires calls ``advance(now)`` and
hands the events to whoever submitted the request: its first token, and its end with the prompt,
cached and completion tokens the engine reports (what the dataplane reads from the usage chunk).
A turn that a client gives up (a cancel) is cancelled in the model.

:meth:`EnginePool.load` reads a replica's ``load()``: what its ``/metrics`` would say when probed
(running and waiting requests, token usage, cache hit rate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from luftpause.testkit.engine.model import (
    EngineModel,
    EngineRequest,
    FirstTokenGenerated,
    PrefixNode,
    RequestFinished,
)
from luftpause.testkit.sim.clock import Timer, VirtualClock
from luftpause.testkit.sim.workload import Turn


@dataclass(frozen=True, slots=True)
class Usage:
    """What a finished turn's usage says: tokens of its prompt, of those cached, of its reply."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Probe:
    """A replica's engine load as its ``/metrics`` would report it at a probe."""

    running: int
    waiting: int
    kv_usage: float | None
    cache_hit_rate: float | None


class Listener(Protocol):
    """Who submitted a turn: told of its first token and its end."""

    def first_token(self, turn: Turn, replica: int, now: float) -> None: ...

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None: ...


CLASS_PRIORITY = {"interactive": 1, "batch": 0}
"""The ``priority`` each class's agents put in their requests' bodies (a higher value is more
urgent; an engine that serves lower values first gets them negated, see
:attr:`EnginePool.priority_sign`). Only an engine started with priority scheduling reads it."""


class EnginePool:
    """``engines`` engine models on ``clock``, one per replica, named ``names``.

    ``priority_sign``: ``1`` for engines that serve higher ``priority`` values first (SGLang's
    ``--enable-priority-scheduling``), ``-1`` for lower first (vLLM's ``--scheduling-policy
    priority``)."""

    def __init__(
        self,
        clock: VirtualClock,
        engines: Sequence[EngineModel],
        names: Sequence[str],
        priority_sign: int = 1,
    ) -> None:
        self.clock = clock
        self.priority_sign = priority_sign
        self.engines = list(engines)
        self.names = list(names)
        self._timers = [Timer(clock, self._firer(index)) for index in range(len(self.engines))]
        self._pending: dict[str, tuple[Turn, int, Listener]] = {}
        self.submitted = [0] * len(self.engines)

    def __len__(self) -> int:
        return len(self.engines)

    def max_running(self) -> int:
        """The first engine's running-request bound (its ``/server_info`` ``max_running_requests``)."""
        return self.engines[0].profile.max_running

    def _firer(self, index: int) -> Callable[[], None]:
        return lambda: self._advance(index)

    def submit(self, replica: int, turn: Turn, listener: Listener) -> None:
        """Send ``turn`` to ``replica``'s engine now; ``listener`` hears of its first token and end.

        The request carries its class's priority (:data:`CLASS_PRIORITY`) and its run's start as
        its program's arrival, as every arrangement relays the agents' request bodies."""
        priority = CLASS_PRIORITY[turn.run.service_class] * self.priority_sign
        self._pending[turn.turn_id] = (turn, replica, listener)
        self.submitted[replica] += 1
        turn.run.replicas.append(self.names[replica])
        request = EngineRequest(
            turn.turn_id,
            turn.prompt,
            turn.output_tokens,
            reply=turn.reply,
            priority=priority,
            max_tokens=max(turn.max_tokens, turn.output_tokens),
            program_arrival=turn.run.started_at,
        )
        self.engines[replica].submit(request, self.clock.now)
        self._rearm(replica)

    def cancel(self, turn_id: str) -> tuple[Turn, int] | None:
        """The client of ``turn_id`` left: the engine drops it (waiting or running); the turn and
        its replica, or ``None`` if it was not in an engine."""
        entry = self._pending.pop(turn_id, None)
        if entry is None:
            return None
        turn, replica, _ = entry
        self.engines[replica].cancel(turn_id, self.clock.now)
        self._rearm(replica)
        return turn, replica

    def hold(self, replica: int, nodes: tuple[PrefixNode, ...]) -> int | None:
        """Pin ``nodes`` in ``replica``'s prefix cache (:meth:`EngineModel.hold`): a handle, or
        ``None`` when the cache holds none of them."""
        return self.engines[replica].hold(nodes, self.clock.now)

    def release(self, replica: int, handle: int) -> None:
        """Undo a :meth:`hold`; a turn waiting for the room may start."""
        self.engines[replica].release(handle, self.clock.now)
        self._rearm(replica)

    def probe(self, replica: int) -> Probe:
        """What ``replica``'s ``/metrics`` would say now."""
        load = self.engines[replica].load()
        return Probe(load.running, load.waiting, load.token_usage, load.cache_hit_rate)

    def stats(self, replica: int) -> dict[str, float]:
        """The engine model's totals (retractions, prompt and cached tokens) for the report."""
        load = self.engines[replica].load()
        return {
            "retractions": load.retractions,
            "promptTokens": load.prompt_tokens_total,
            "cachedTokens": load.cached_tokens_total,
            "finished": load.finished_total,
        }

    def _rearm(self, replica: int) -> None:
        self._timers[replica].set(self.engines[replica].next_event_time())

    def _advance(self, replica: int) -> None:
        now = self.clock.now
        for event in self.engines[replica].advance(now):
            if isinstance(event, FirstTokenGenerated):
                entry = self._pending.get(event.request_id)
                if entry is not None:
                    turn, at, listener = entry
                    turn.first_token_at = event.time
                    listener.first_token(turn, at, event.time)
            elif isinstance(event, RequestFinished):
                entry = self._pending.pop(event.request_id, None)
                if entry is not None:
                    turn, at, listener = entry
                    usage = Usage(event.prompt_tokens, event.cached_tokens, event.completion_tokens)
                    listener.finished(turn, at, usage, event.time)
        self._rearm(replica)
