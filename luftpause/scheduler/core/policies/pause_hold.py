"""How long a tool-paused interactive run keeps its headroom slot: a hold per pause, bounded by a
time-to-live learned from the tool times that run, or else its caller, has shown.

The headroom slot (:mod:`.headroom`) is worth keeping only while the run is likely to come back
soon: a session cut off in the middle of a tool call (a harness's turn limit, a failed turn)
leaves its run ``tool_paused`` for good, and with an unbounded hold its slot stayed kept from batch
turns until the run expired (30 min). So each pause gets a TTL when it begins, after the
Continuum scheduler (arXiv 2511.02230, which pins a paused request's KV for a TTL chosen from the
tool-call durations it has seen): ``factor`` times the longest of the run's own recent pauses
(else its caller's), within ``[min_s, max_s]``, or ``default_s`` before any pause was seen. A pause
that outlives its TTL gives the slot back at the next clock tick; the run keeps its affinity. A run
that ends (``RunEnded``: ``DELETE /v1/runs/{id}``, or the runtime cancelling it) gives it back at
once, as before.

``mode``: ``"ttl"`` (the default, the above), ``"pause"`` (hold for the whole pause, as before
this policy: for measuring what the bound costs) or ``"off"`` (no headroom at all).

Reads: the time the pause began and the pause durations observed (seconds of the shell's clock:
the time from a run entering ``tool_paused`` to the arrival of its next turn), the last
:data:`HISTORY` per run and per caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

HoldMode = Literal["ttl", "pause", "off"]

HISTORY = 16
"""Pause durations remembered per run and per caller (the most recent)."""


@dataclass(frozen=True, slots=True)
class PauseHold:
    """The hold's settings (seconds); the defaults are the scheduler's."""

    mode: HoldMode = "ttl"
    default_s: float = 10.0
    """The TTL of a pause when neither the run nor its caller has shown one yet."""
    factor: float = 2.0
    min_s: float = 1.0
    max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.mode not in ("ttl", "pause", "off"):
            raise ValueError(f"mode must be ttl, pause or off, got {self.mode!r}")
        if not (0 < self.min_s <= self.max_s) or self.factor <= 0 or self.default_s <= 0:
            raise ValueError("the hold's times and factor must be positive, min_s <= max_s")


def ttl(settings: PauseHold, run_pauses: Sequence[float], caller_pauses: Sequence[float]) -> float | None:
    """Seconds a pause beginning now keeps its slot; ``None``: for the whole pause (mode ``pause``)."""
    if settings.mode == "pause":
        return None
    seen = run_pauses or caller_pauses
    if not seen:
        return settings.default_s
    return min(settings.max_s, max(settings.min_s, settings.factor * max(seen)))


def holds(settings: PauseHold) -> bool:
    """Whether tool-paused interactive runs keep headroom at all."""
    return settings.mode != "off"


def expired(hold_until: float | None, now: float) -> bool:
    """True when a hold that lasts until ``hold_until`` (``None``: no end) is over at ``now``."""
    return hold_until is not None and now >= hold_until


def remember(history: list[float], pause: float) -> None:
    """Add ``pause`` (seconds, clamped at 0) to ``history``, keeping the last :data:`HISTORY`."""
    history.append(max(0.0, pause))
    if len(history) > HISTORY:
        del history[: len(history) - HISTORY]
