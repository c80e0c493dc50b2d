"""Continuum (arXiv 2511.02230; the vLLM fork ``Hanchenli/vllm-continuum``, ``--scheduling-policy
continuum``) behind SGLang's classless router: a mechanism of the engines, not of the router.

The model is built from the paper (arXiv 2511.02230: its scheduling policy, tool-call TTL cost model
and evaluation settings) and the fork's public description (its README's ``job_id`` /
``is_last_step`` request fields and ``--scheduling-policy continuum``); it has not been checked
line by line against the fork's scheduler code. What is modelled:

* **Program-level first-come first-served.** Each request names its job (``job_id``, here the
  run) and whether it is the job's last step (``is_last_step``). The engine's waiting queue is
  ordered by when each job sent its first request, then by arrival
  (:mod:`luftpause.testkit.engine.model.queue_order`, ``"program"``), so a job that started
  earlier goes first on every turn.
* **Time-to-live pins.** When a request that is not its job's last step ends (its reply calls a
  tool), the engine keeps its KV (the prompt and the reply, :meth:`EngineModel.hold`) pinned in
  the pool, out of eviction's reach, if the tool's past durations (a moving average per tool)
  are under the pin threshold of 2.0 s, or nothing is known of that tool yet. The pin ends when
  the job's next request starts on that engine (it then holds its own prefix), when its TTL runs
  out, or when the job ends. The TTL is the threshold itself (2.0 s): the paper's cost model
  chooses it from the tool-time distribution, the reload cost and the queueing an eviction
  causes; with tools mostly well under 2 s the two agree, and a tool that runs past its TTL is
  treated as the paper treats it, its KV freed for others.
* Tools are told apart by the agent group (each group calls its own tool).
* In front: SGLang's router 0.3.2 ``cache_aware`` (:class:`~.arrangements.Router`); no classes.
  Continuum's queue order replaces the engines' ``fcfs``, ``lpm`` or ``priority`` setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.testkit.sim.arrangements import Router
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import EnginePool, Usage
from luftpause.testkit.sim.workload import Run, Turn

PIN_THRESHOLD_S = 2.0
TTL_S = 2.0
AVERAGE_WEIGHT = 0.2
"""Weight of the newest tool duration in the moving average."""


@dataclass(slots=True)
class _Pin:
    replica: int
    handle: int


class Continuum(Router):
    """Continuum's engines behind SGLang's router (see the module docstring); the engines must be
    built with the ``program`` schedule policy (:func:`~.flood.simulate` does so)."""

    name = "continuum"

    def __init__(self, clock: VirtualClock, pool: EnginePool) -> None:
        super().__init__(clock, pool)
        self.pins: dict[str, _Pin] = {}
        self.tool_average: dict[int, float] = {}
        self._paused_at: dict[str, float] = {}
        self.counts = {"pinned": 0, "notPinned": 0, "expired": 0}

    def send(self, turn: Turn, now: float) -> None:
        run = turn.run
        paused = self._paused_at.pop(run.run_id, None)
        if paused is not None:
            seen = now - paused
            average = self.tool_average.get(run.group)
            self.tool_average[run.group] = (
                seen if average is None else AVERAGE_WEIGHT * seen + (1 - AVERAGE_WEIGHT) * average
            )
        super().send(turn, now)

    def first_token(self, turn: Turn, replica: int, now: float) -> None:
        pin = self.pins.get(turn.run.run_id)
        if pin is not None and pin.replica == replica:
            self._unpin(turn.run.run_id)

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None:
        run_id = turn.run.run_id
        self._unpin(run_id)
        if turn.tool_call:
            self._paused_at[run_id] = now
            average = self.tool_average.get(turn.run.group)
            if average is None or average < PIN_THRESHOLD_S:
                handle = self.pool.hold(replica, (*turn.prompt.nodes, turn.reply))
                if handle is not None:
                    self.pins[run_id] = _Pin(replica, handle)
                    self.counts["pinned"] += 1
                    self.clock.call_later(TTL_S, lambda: self._expire(run_id, handle))
            else:
                self.counts["notPinned"] += 1
        super().finished(turn, replica, usage, now)

    def end_run(self, run: Run, now: float) -> None:
        self._paused_at.pop(run.run_id, None)
        self._unpin(run.run_id)

    def _expire(self, run_id: str, handle: int) -> None:
        pin = self.pins.get(run_id)
        if pin is not None and pin.handle == handle:
            self.counts["expired"] += 1
            self._unpin(run_id)

    def _unpin(self, run_id: str) -> None:
        pin = self.pins.pop(run_id, None)
        if pin is not None:
            self.pool.release(pin.replica, pin.handle)

    def counters(self) -> dict[str, int]:
        return dict(self.counts)
