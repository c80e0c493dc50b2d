"""How long a tool-paused interactive run keeps its headroom slot: a hold per pause, sized by what
holding the slot saves against what it costs, from the pauses its caller has shown.

The headroom slot (:mod:`.headroom`) saves the run, when it comes back, the wait for a slot of its
replica: on a full replica, about the time until the next of its turns ends (``saved_s``: a turn's
time on the replica over its slots, :func:`saved_wait`). It costs, for as long as it is kept, a
slot that a batch turn could use (a slot-second a second). After Continuum (arXiv 2511.02230,
which pins a paused request's KV cache for a TTL only when the tool call is expected to end soon
enough for the pin to pay), each pause gets a TTL when it begins, ``mode = "cost"`` (the default):
the one that maximizes, over the caller's recent pauses ``s_1 <= ... <= s_n`` (the run's own while
its caller has shown none),

    value(t) = worth * saved_s * P(pause <= t) - E[min(pause, t)]

(seconds of the run's waiting saved, weighed ``worth`` slot-seconds each, less the slot-seconds
kept idle), which is the largest at one of the ``s_k``; a TTL of 0 keeps no slot at all. Holding on
past a pause length ``t`` pays while the rate at which paused runs come back at ``t`` (the hazard
of the pause distribution) times ``worth * saved_s`` exceeds one: short, regular pauses are held
for their whole length, and the long tail of a heavy-tailed distribution (tools that take a
minute) is not held at all, where a multiple of past pauses (the rule before) kept slots idle for
up to ``max_s``. Before the caller or run has shown a pause, or before the replica has finished a
turn, the TTL is ``default_s``.

A pause that outlives its TTL gives the slot back at the next clock tick (a TTL of 0: keeps none
from the start); the run keeps its affinity, so a session cut off in the middle of a tool call
gives its slot back. A run that ends (``RunEnded``) gives it back at once.

Other modes, for measuring: ``"ttl"`` (the rule before: ``factor`` times the longest of the run's,
else its caller's, recent pauses, within ``[min_s, max_s]``), ``"pause"`` (hold for the whole pause)
and ``"off"`` (no headroom at all).

Reads: the pause durations observed (seconds from a run entering ``tool_paused`` to the arrival of
its next turn), the last :data:`HISTORY` per run and :data:`CALLER_HISTORY` per caller; the
replica's mean turn time (``Replica.turn_s``, seconds from placement to end of its finished
generative turns, :func:`learn_turn_time`) and its effective capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

HoldMode = Literal["cost", "ttl", "pause", "off"]
HOLD_MODES: tuple[HoldMode, ...] = ("cost", "ttl", "pause", "off")

HISTORY = 16
"""Pause durations remembered per run (the most recent)."""
CALLER_HISTORY = 64
"""Pause durations remembered per caller (the most recent): the distribution the hold is sized on."""
TURN_TIME_WEIGHT = 0.1
"""Weight of a finished turn in its replica's moving mean of turn times (:func:`learn_turn_time`)."""


@dataclass(frozen=True, slots=True)
class PauseHold:
    """The hold's settings (seconds); the defaults are the scheduler's."""

    mode: HoldMode = "cost"
    default_s: float = 10.0
    """The TTL of a pause before its caller (or run) has shown one, or its replica finished a turn."""
    worth: float = 8.0
    """``cost``: slot-seconds of batch service one second of an interactive run's waiting is worth."""
    factor: float = 2.0
    """``ttl``: the TTL in longest recent pauses."""
    min_s: float = 1.0
    """``ttl``: the shortest TTL."""
    max_s: float = 60.0
    """Every mode but ``pause``: the longest TTL."""

    def __post_init__(self) -> None:
        if self.mode not in HOLD_MODES:
            raise ValueError(f"mode must be one of {', '.join(HOLD_MODES)}, got {self.mode!r}")
        if not (0 < self.min_s <= self.max_s) or self.factor <= 0 or self.default_s <= 0:
            raise ValueError("the hold's times and factor must be positive, min_s <= max_s")
        if not self.worth > 0:
            raise ValueError(f"worth must be positive, got {self.worth!r}")


def ttl(
    settings: PauseHold,
    run_pauses: Sequence[float],
    caller_pauses: Sequence[float],
    saved_s: float | None = None,
) -> float | None:
    """Seconds a pause beginning now keeps its slot (0: none); ``None``: the whole pause (``pause``).

    ``saved_s``: seconds a returning turn would wait for a slot of the replica (:func:`saved_wait`;
    ``None``: not known yet), read by ``cost`` only.
    """
    if settings.mode == "pause":
        return None
    if settings.mode == "cost":
        seen = caller_pauses or run_pauses
        if not seen or saved_s is None:
            return settings.default_s
        return min(settings.max_s, best_hold(seen, settings.worth * saved_s))
    seen = run_pauses or caller_pauses
    if not seen:
        return settings.default_s
    return min(settings.max_s, max(settings.min_s, settings.factor * max(seen)))


def best_hold(pauses: Sequence[float], gain_s: float) -> float:
    """The hold (seconds) that maximizes ``gain_s * P(pause <= t) - E[min(pause, t)]`` over the
    empirical distribution of ``pauses`` (each a pause length, seconds); 0 when no hold gains.

    ``gain_s``: slot-seconds a run coming back within its hold saves. The value steps up by
    ``gain_s / n`` at each pause and falls between them as the slot stays idle, so the best is at
    one of the pauses (or 0).
    """
    ordered = sorted(pauses)
    n = len(ordered)
    best_t, best_value = 0.0, 0.0
    done = 0.0  # sum of the pauses up to and including the k-th
    for k, pause in enumerate(ordered, start=1):
        done += pause
        # n * value: k pauses returned within t = pause, the other n - k kept the slot all along
        value = gain_s * k - done - (n - k) * pause
        if value > best_value:
            best_t, best_value = pause, value
    return best_t


def saved_wait(turn_s: float | None, capacity: int) -> float | None:
    """Seconds a turn coming back to a full replica waits for its next free slot, about: a turn's
    time there (``turn_s``) over its ``capacity`` slots; ``None`` while no turn has finished there."""
    if turn_s is None:
        return None
    return turn_s / max(1, capacity)


def learn_turn_time(known: float | None, seconds: float) -> float:
    """The replica's mean turn time after a turn that took ``seconds`` (placement to end) finished."""
    seconds = max(0.0, seconds)
    return seconds if known is None else known + TURN_TIME_WEIGHT * (seconds - known)


def holds(settings: PauseHold) -> bool:
    """Whether tool-paused interactive runs keep headroom at all."""
    return settings.mode != "off"


def expired(hold_until: float | None, now: float) -> bool:
    """True when a hold that lasts until ``hold_until`` (``None``: no end) is over at ``now``."""
    return hold_until is not None and now >= hold_until


def remember(history: list[float], pause: float, keep: int = HISTORY) -> None:
    """Add ``pause`` (seconds, clamped at 0) to ``history``, keeping the last ``keep``."""
    history.append(max(0.0, pause))
    if len(history) > keep:
        del history[: len(history) - keep]
