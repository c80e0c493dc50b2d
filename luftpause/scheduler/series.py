"""The scheduler's last minutes for its live page: held turns by class, time to first token by
class and runs by phase, one sample every 2 s for 10 min (:mod:`luftpause.observe.series`), served as
``GET /series`` (:mod:`luftpause.scheduler.status_http`).

A sample (beside ``seq`` and ``t``)::

    {"held": {"interactive": int, "batch": int},           # generative turns held at that moment
     "ttft_s": {"interactive": window, "batch": window},    # first tokens reported since the last
                                                            # sample: {"n", "p50", "p95", "max"},
                                                            # seconds (None without any)
     "runs": {"idle": int, "generating": int, "tool_paused": int}}

Time to first token, as the scheduler learns it from the dataplanes' reports: from the turn's
arrival here (its ``TurnArrived``; a turn placed under a capacity lease: its ``LeasedTurnPlaced``,
which the dataplane sends as it places the turn) to its ``FirstToken``, which the dataplane dates
in its FINISHED or FAILED report (``first_token_ago_s``, :mod:`luftpause.scheduler.grpc_service`).
So a sample's window holds the turns whose report came in that interval, and the time includes the
wait here (held turns) as the client lives it, less the dataplane's own sub-millisecond part before
its Admit. Single-pass turns and whole (non-streamed) answers have no first token and are left
out (the dataplane's own histogram counts a whole answer's whole time).

Cost: :meth:`SchedulerSeries.observe` is one type test per event, and a dict insert and pop per
turn (arrival, first token or end); the dict holds the turns in flight only (turns the core forgets
otherwise, expired or released, are pruned at each sample). :meth:`SchedulerSeries.tick` walks the
held turns and the runs once per sample, as ``GET /status`` does once per call.
"""

from __future__ import annotations

from typing import Any

from luftpause.observe.series import SeriesRing, Window
from luftpause.scheduler.core import (
    AbandonReported,
    Event,
    FirstToken,
    LeasedTurnPlaced,
    ServiceClass,
    State,
    TurnAbandoned,
    TurnArrived,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.core.events import RUN_PHASES, SERVICE_CLASSES


class SchedulerSeries:
    """The ring of the scheduler's samples and the first-token times gathered between two."""

    def __init__(self, ring: SeriesRing | None = None) -> None:
        self.ring = ring if ring is not None else SeriesRing()
        self._arrived: dict[str, tuple[float, ServiceClass]] = {}
        self._ttft = {service_class: Window() for service_class in SERVICE_CLASSES}
        self._last_sample_at: float | None = None

    def observe(self, event: Event) -> None:
        """Take what ``event`` (fed to the core) says about first tokens."""
        kind = type(event)
        if kind is TurnArrived or kind is LeasedTurnPlaced:
            assert isinstance(event, TurnArrived | LeasedTurnPlaced)
            if not getattr(event, "single_pass", False):
                # An Admit re-sent on a new stream keeps its first arrival.
                self._arrived.setdefault(event.turn_id, (event.at, event.service_class))
        elif kind is FirstToken:
            assert isinstance(event, FirstToken)
            arrived = self._arrived.pop(event.turn_id, None)
            if arrived is not None:
                at, service_class = arrived
                self._ttft[service_class].add(max(event.at - at, 0.0))
        elif kind is TurnFinished or kind is TurnFailed or kind is TurnAbandoned or kind is AbandonReported:
            self._arrived.pop(getattr(event, "turn_id", ""), None)

    def tick(self, state: State, now: float, wall: float) -> bool:
        """Take a sample of ``state`` when the ring's interval has passed since the last (``now``:
        the shell's monotonic seconds; ``wall``: Unix seconds, the sample's ``t``); True when
        one was taken. Call it on every clock tick."""
        if self._last_sample_at is not None and now - self._last_sample_at < self.ring.interval_s - 0.05:
            return False
        self._last_sample_at = now
        self.ring.add(wall, self.sample(state))
        return True

    def sample(self, state: State) -> dict[str, Any]:
        """The values of one sample of ``state`` (module docstring); empties the first-token windows."""
        held = dict.fromkeys(SERVICE_CLASSES, 0)
        for turn in state.held:
            if not turn.single_pass:
                held[turn.service_class] += 1
        runs = dict.fromkeys(RUN_PHASES, 0)
        for run in state.runs.values():
            runs[run.phase] = runs.get(run.phase, 0) + 1
        # Turns the core gave up without an end event here (expired, released) leave the dict.
        for turn_id in [t for t in self._arrived if t not in state.placed and t not in state.held]:
            del self._arrived[turn_id]
        return {
            "held": held,
            "ttft_s": {service_class: window.take() for service_class, window in self._ttft.items()},
            "runs": runs,
        }
