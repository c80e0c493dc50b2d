"""Protection limits (opt-in): how many turns a caller may have held per class, how long one may
wait, and how many tokens per second its turns may use; off, a held turn waits without bound.

Per caller and service class (docs/architecture.md "Auth": protection limits are opt-in), from
``[scheduler.protection]``: per-class defaults, and per-caller overrides that replace a default key
by key for every class of that caller.

Callers form a tree (:mod:`.caller_tree`: ``team-a/job-7`` is under ``team-a``), and a limit is
held by a *name* of it, never escaped by narrowing: the limits of caller ``a/b/c`` are those of the
most specific configured name among ``a/b/c``, ``a/b`` and ``a``, else the class defaults; and its
held turns and token bucket are counted for that name, the *holder* (:meth:`Protection.holder`):
with no configured name in its lineage, its root. So ``team-a/job-1`` and ``team-a/job-2`` count
together against ``team-a``'s limits (the class defaults, when ``team-a`` is not configured), and
narrowing into a hundred callers yields no more than one root is allowed. A configured sub-caller
(``callers."team-a/ci"``) is a holder of its own: its limits replace ``team-a``'s for it and
everything under it, whose turns count for it and not for ``team-a`` (:meth:`Protection.carved`).
The counts and buckets are kept per ``(holder, class)``.

* ``max_held``: a turn that would be held while its holder already has this many turns of its
  class held is refused at once (it never arrives: nothing is held or recorded of it). A turn
  placed at once is never refused by it.
* ``queue_timeout_s``: a turn held this long is refused on the next clock tick (1 s), its Admit
  answered.
* ``tokens_per_s``: a token bucket of ``burst_tokens`` (by default ``tokens_per_s`` times
  :data:`BURST_S`), full at first, filling at ``tokens_per_s`` and drained by the prompt and
  completion tokens of each finished turn (the usage the dataplane reports; the bucket may go below
  zero, since usage is known only after the fact). A turn arriving while its holder's bucket holds
  less than one token is refused at once, its ``Retry-After`` the time the bucket takes to get back
  to one.

Every refusal is an HTTP 429 (``Reject(..., 429, retry_after_s)``: the dataplane answers it with
``Retry-After`` and the JSON error), naming the holder whose limit was hit and, when it is not the
turn's own caller, that caller too (``caller 'team-a' (for 'team-a/job-7') has 3 interactive
turns held, ...``); held-turn and queue-timeout refusals say ``Retry-After: 1``
(:data:`RETRY_AFTER_S`).

Reads: the turn's caller and class, the holder's held turns of that class, how long a held turn has
waited, the bucket's level and when it was last filled (seconds of the shell's clock), the finished
turn's token counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from luftpause.scheduler.core.policies import breaker as breaker_policy
from luftpause.scheduler.core.policies import caller_tree

if TYPE_CHECKING:
    from luftpause.scheduler.core.events import ServiceClass

LIMITED_STATUS = 429
RETRY_AFTER_S = 1.0
"""``Retry-After`` of a refusal for held turns or a queue timeout: the pool is busy, try soon."""
BURST_S = 10.0
"""Default bucket size in seconds of the rate: a caller may spend 10 s worth of tokens at once."""
MAX_BUCKETS = 100_000
"""Token buckets kept at most; full ones are dropped on every tick, the oldest first past this."""


@dataclass(frozen=True, slots=True)
class ClassLimits:
    """The limits of one caller and class; ``None``: that limit is off."""

    max_held: int | None = None
    queue_timeout_s: float | None = None
    tokens_per_s: float | None = None
    burst_tokens: float | None = None
    """Bucket size (tokens); ``None``: ``tokens_per_s * BURST_S``."""

    def __post_init__(self) -> None:
        if self.max_held is not None and self.max_held < 0:
            raise ValueError("max_held must be >= 0")
        for name in ("queue_timeout_s", "tokens_per_s", "burst_tokens"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0")

    def over(self, other: ClassLimits) -> ClassLimits:
        """These limits with every key ``other`` sets replaced by ``other``'s."""
        changed = {
            f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None
        }
        return replace(self, **changed) if changed else self

    @property
    def burst(self) -> float:
        """The bucket size in tokens (0 when no rate is set)."""
        if self.tokens_per_s is None:
            return 0.0
        return self.burst_tokens if self.burst_tokens is not None else self.tokens_per_s * BURST_S


OFF = ClassLimits()


@dataclass(frozen=True, slots=True)
class Protection:
    """Every limit of one scheduler; the default has none (today's behaviour)."""

    classes: Mapping[str, ClassLimits] = field(default_factory=dict)
    """Service class -> its defaults."""
    callers: Mapping[str, ClassLimits] = field(default_factory=dict)
    """Caller -> what it overrides, for every class of it."""
    breaker_failures: int = 0
    """Engine-fault failures within ``breaker_window_s`` on one replica that open its breaker
    (:mod:`.breaker`); 0: off (an unreachable engine still opens it)."""
    breaker_window_s: float = 60.0
    """Seconds a failure counts toward ``breaker_failures``."""
    breaker_open_s: float = 0.0
    """Seconds an open breaker stays open at least before a healthy probe makes it half-open."""
    breaker_success_threshold: int = 1
    """Trial turns finished in a row that close a half-open breaker."""
    breaker_trial_turns: int = 1
    """Turns a half-open replica takes at once."""

    breaker: breaker_policy.Settings = field(init=False, repr=False, compare=False)
    """The ``breaker_*`` fields as the breaker's settings."""
    _carved: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    """Holder -> the configured names that are holders of their own below it (see :meth:`carved`)."""

    def __post_init__(self) -> None:
        settings = breaker_policy.Settings(
            self.breaker_failures,
            self.breaker_window_s,
            self.breaker_open_s,
            self.breaker_success_threshold,
            self.breaker_trial_turns,
        )
        object.__setattr__(self, "breaker", settings)
        carved: dict[str, list[str]] = {}
        for name in sorted(self.callers):
            above = caller_tree.parent(name)
            if above is not None:
                carved.setdefault(self.holder(above), []).append(name)
        object.__setattr__(self, "_carved", {holder: tuple(names) for holder, names in carved.items()})

    @property
    def on(self) -> bool:
        """True when any held, timeout or rate limit is set (the breaker apart)."""
        return any(limits != OFF for limits in (*self.classes.values(), *self.callers.values()))

    def holder(self, caller: str) -> str:
        """The name that holds ``caller``'s limits and counts: the most specific configured name of
        its lineage (itself, then each caller above it), else its root."""
        callers = self.callers
        name = caller
        while name not in callers:
            cut = name.rfind(caller_tree.SEPARATOR)
            if cut < 0:
                return name  # the root, not configured: the class defaults, counted for it
            name = name[:cut]
        return name

    def carved(self, holder: str) -> tuple[str, ...]:
        """The configured names below ``holder`` that hold their own limits (the nearest ones: none
        of them is below another): what is held under them is not ``holder``'s to count."""
        return self._carved.get(holder, ())

    def of(self, caller: str, service_class: ServiceClass) -> ClassLimits:
        """The limits of ``caller``'s turns of ``service_class``: those of its holder."""
        limits = self.classes.get(service_class, OFF)
        override = self.callers.get(self.holder(caller))
        return limits if override is None else limits.over(override)

    @property
    def shortest_timeout_s(self) -> float | None:
        """The shortest queue timeout of any class or caller (``None``: none set): a held turn
        younger than it cannot have timed out, so a tick looks no further into the queue."""
        values = [
            limits.queue_timeout_s
            for limits in (*self.classes.values(), *self.callers.values())
            if limits.queue_timeout_s is not None
        ]
        return min(values) if values else None


@dataclass(slots=True)
class Bucket:
    """A token bucket: ``level`` tokens at ``at`` (seconds); may be negative."""

    level: float
    at: float


def refill(bucket: Bucket, limits: ClassLimits, now: float) -> float:
    """Fill ``bucket`` to ``now`` at ``limits``' rate, up to its size; the level."""
    rate = limits.tokens_per_s or 0.0
    bucket.level = min(limits.burst, bucket.level + rate * max(0.0, now - bucket.at))
    bucket.at = max(bucket.at, now)
    return bucket.level


def rate_retry_after(level: float, limits: ClassLimits) -> float | None:
    """Seconds until a bucket at ``level`` holds one token again; ``None``: it holds one now."""
    if level >= 1.0 or not limits.tokens_per_s:
        return None
    return max(1.0, math.ceil((1.0 - level) / limits.tokens_per_s))


def held_over(held: int, limits: ClassLimits) -> bool:
    """True when a caller with ``held`` turns of a class held may not have one more held."""
    return limits.max_held is not None and held >= limits.max_held


def timed_out(arrived_at: float, now: float, limits: ClassLimits) -> bool:
    """True when a turn held since ``arrived_at`` is past its queue timeout at ``now``."""
    return limits.queue_timeout_s is not None and now - arrived_at >= limits.queue_timeout_s


def _who(holder: str, caller: str) -> str:
    """The holder a refusal names, and the turn's caller when that is another (below it)."""
    who = f"caller '{holder}'" if holder else "the anonymous caller"
    return who if caller == holder else f"{who} (for '{caller}')"


def held_reason(holder: str, caller: str, service_class: ServiceClass, held: int, limits: ClassLimits) -> str:
    """``caller 'team-a' (for 'team-a/job-7') has 3 interactive turns held, its limit (max_held =
    3)``; ``holder`` is ``caller``'s (:meth:`Protection.holder`), named alone when it is ``caller``."""
    return (
        f"{_who(holder, caller)} has {held} {service_class} turns held, its limit "
        f"(max_held = {limits.max_held})"
    )


def timeout_reason(waited: float, limits: ClassLimits) -> str:
    return f"turn held {waited:.0f} s, past its queue timeout ({limits.queue_timeout_s:g} s)"


def rate_reason(holder: str, caller: str, service_class: ServiceClass, limits: ClassLimits) -> str:
    """``caller 'team-a' (for 'team-a/job-7') used up its interactive token rate (2 tokens/s)``."""
    return f"{_who(holder, caller)} used up its {service_class} token rate ({limits.tokens_per_s:g} tokens/s)"
