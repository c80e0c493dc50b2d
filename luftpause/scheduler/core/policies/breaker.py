"""Circuit breaker: closed, open, half-open, as operators know it.

A health endpoint may answer 200 while every turn fails (an engine out of memory, a model that
failed to load behind a router): without the breaker each such turn costs its client an error until
the probe, every 2 s, notices nothing. The breaker of each replica has three states:

* ``closed`` - it takes turns. With ``[scheduler.protection] breaker_failures = N`` (0, the
  default: off), the N-th turn to fail there with an engine fault, counting only failures of the
  last ``breaker_window_s`` seconds since its last finished turn, *opens* it. Failures that are not
  the engine's (the client left mid-stream: ``TurnFailed.engine_fault`` false) are not counted.
* ``open`` - it takes no turn (:mod:`.health`). The first healthy probe at least
  ``breaker_open_s`` seconds after it opened makes it half-open.
* ``half_open`` - it takes at most ``breaker_trial_turns`` turns at once (:mod:`.capacity`), the
  *trial turns*; others go elsewhere or wait. ``breaker_success_threshold`` turns finished there
  in a row close it; a turn failing there with an engine fault, or an unhealthy probe, opens it
  again (its ``open_s`` counted afresh).

A turn whose engine was never reached (``TurnFailed.unreachable``: the connection refused, or
reset or timed out before any byte of the answer) opens it at once, whatever the threshold and
even with the breaker off: the replica is down, and the next probe may be 2 s away while the
dataplane sends its turn to another replica (docs/failover.md).

Time comes from the events (``at``, the shell's monotonic seconds): the core reads no clock. This is
why no breaker library is used: pybreaker and aiobreaker read the wall clock themselves and wrap
the call they guard (they run it), while here the turn runs in a dataplane and its outcome reaches
the core as an event.

Every transition is returned as a :data:`Transition` for the caller to count and report.

Reads: the replica's breaker state, fault times, open time and trial successes; the failed turn's
``engine_fault`` and ``unreachable``; the :class:`Settings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica

BreakerState = Literal["closed", "open", "half_open"]
"""A breaker's state (the ``from`` and ``to`` labels of its transitions metric)."""

STATES: tuple[BreakerState, ...] = ("closed", "open", "half_open")


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of a replica's breaker: ``before`` -> ``after``, ``reason`` in words."""

    before: BreakerState
    after: BreakerState
    reason: str


@dataclass(frozen=True, slots=True)
class Settings:
    """The breaker's settings (``[scheduler.protection] breaker_*``); the default is off for engine
    faults (an unreachable engine still opens it) and half-open on the next healthy probe."""

    failures: int = 0
    """Engine-fault failures within ``window_s`` that open a closed breaker; 0: only unreachable."""
    window_s: float = 60.0
    """Seconds a failure counts toward ``failures``."""
    open_s: float = 0.0
    """Seconds an open breaker stays open at least; the first healthy probe after makes it half-open."""
    success_threshold: int = 1
    """Trial turns finished in a row that close a half-open breaker."""
    trial_turns: int = 1
    """Turns a half-open replica takes at once."""

    def __post_init__(self) -> None:
        if self.failures < 0:
            raise ValueError("breaker_failures must be >= 0")
        if self.window_s <= 0 or self.open_s < 0:
            raise ValueError("breaker_window_s must be > 0 and breaker_open_s >= 0")
        if self.success_threshold < 1 or self.trial_turns < 1:
            raise ValueError("breaker_success_threshold and breaker_trial_turns must be >= 1")


def _move(replica: Replica, after: BreakerState, at: float, reason: str) -> Transition:
    before = replica.breaker
    replica.breaker = after
    replica.fault_times.clear()
    replica.trial_successes = 0
    if after == "open":
        replica.opened_at = at
    return Transition(before, after, reason)


def failed(
    replica: Replica, engine_fault: bool, at: float, settings: Settings, unreachable: bool = False
) -> Transition | None:
    """Count one failed turn of ``replica`` at ``at`` (seconds); the transition it causes, if any."""
    if unreachable and replica.breaker != "open":
        return _move(replica, "open", at, "engine unreachable")
    if not engine_fault or replica.breaker == "open":
        return None
    if replica.breaker == "half_open":
        return _move(replica, "open", at, "a trial turn failed")
    if settings.failures <= 0:
        return None
    times = replica.fault_times
    times.append(at)
    while times and times[0] <= at - settings.window_s:
        times.pop(0)
    if len(times) >= settings.failures:
        return _move(replica, "open", at, f"{len(times)} failed turns within {settings.window_s:g} s")
    return None


def finished(replica: Replica, settings: Settings) -> Transition | None:
    """A turn of ``replica`` finished: the count of failures starts again; in half-open, one more
    trial success (the transition to closed when it is the ``success_threshold``-th)."""
    replica.fault_times.clear()
    if replica.breaker != "half_open":
        return None
    replica.trial_successes += 1
    if replica.trial_successes >= settings.success_threshold:
        return _move(replica, "closed", 0.0, f"{replica.trial_successes} trial turns finished")
    return None


def probed(replica: Replica, healthy: bool, at: float, settings: Settings) -> Transition | None:
    """A probe of ``replica`` at ``at``: a healthy one makes an open breaker half-open once it has
    been open ``open_s``; an unhealthy one opens a half-open breaker again."""
    if replica.breaker == "open" and healthy and at - replica.opened_at >= settings.open_s:
        replica.trial_turns = settings.trial_turns
        return _move(replica, "half_open", at, "a healthy probe")
    if replica.breaker == "half_open" and not healthy:
        return _move(replica, "open", at, "an unhealthy probe")
    return None


def room(replica: Replica) -> int | None:
    """Turns ``replica`` may have in flight by its breaker: 0 when open, its ``trial_turns`` when
    half-open, ``None`` (no bound) when closed."""
    if replica.breaker == "open":
        return 0
    if replica.breaker == "half_open":
        return replica.trial_turns
    return None
