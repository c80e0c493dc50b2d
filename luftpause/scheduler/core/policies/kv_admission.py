"""KV-token admission: a run starts on a replica only while the KV its runs in progress hold fits.

Slots bound the turns an engine computes at once; its KV pool bounds the runs whose prefixes it
keeps. A run in progress on a replica (``generating``, or ``tool_paused`` there: its next turn
comes back to that replica, strict affinity) holds its context in that replica's pool while its
tool runs. When more runs are in progress than the pool holds, every returning turn finds its
prefix evicted by the others and is prefilled again from nothing: the prefix cache thrashes
(bench/README.md "The policy across shapes": with no running bound, a 0.5x pool, 8k or 32k
contexts, 2.8-24 % of prompt tokens cached where ThunderAgent, which admits programs by their
tokens, keeps 71-75 %). After ThunderAgent (arXiv 2602.13692, ``HaoKang-Timmy/ThunderAgent``'s
``tr`` router: a backend's room is its ``max_total_num_tokens`` less its programs' tokens), a
replica whose pool is known (``[[replicas]] kv_tokens``) counts each run in progress there by its
context, and a turn of a run *not* in progress there (a new run, or an idle one) may take a slot
only while

    used + need <= fill * kv_tokens

(``used``: the counted runs' tokens, ``need``: the arriving run's estimate, ``fill``: the share of
the pool runs may claim, :data:`FILL`). Turns of runs already counted there are never held by it
(their context is in the pool already); a replica that counts no run takes any run, and one with
no turn in flight takes a run that fits its whole pool (not only ``fill`` of it): KV estimates
never leave a replica idle while its pool has room (work conservation). (Taking any run whenever
nothing is in flight let a 32k-token flood's first burst, all on their tools at once, start an
eighth run in a pool of seven: two minutes of thrash, 14.3 batch runs/min against 21.3.)
The head of a queue is never overtaken by a smaller run behind it (as SGLang's own admission);
the turns pinned to the replica, which fit by definition, still take its free slots.

A run's count, in tokens, is what its next turn will leave in the pool: its last finished turn's
prompt and completion tokens (what the dataplane reads from the usage), plus the growth a turn
adds (the tool call, its result and the reply: its caller's recent mean, else
:data:`DEFAULT_GROWTH`). A run none of whose turns has finished yet is counted by its caller's
recent first turns (else every caller's, else the replica's pool over :data:`FIRST_SHARE`) plus
the growth. A run is counted from its first placement on the replica until it goes ``idle``, ends
or is forgotten; a replica without ``kv_tokens`` admits by slots alone, as before.

A counted run whose tool outlives what its caller's tools take (:func:`park_after`: twice the third
quartile of the caller's recent pauses, at least 1 s; 10 s before 8 were seen) while turns are held
is *parked* on the next clock tick (ThunderAgent pauses acting programs under KV pressure the same
way): it is counted nowhere and pinned nowhere, so the pool it held goes to held runs, and its
next turn starts again like a new run's, on whichever replica it fits (its prefix may still be
cached where it was; the least loaded replica with room comes first, as for any run). Tools that
take a minute thus do not keep a replica's pool, and with it its slots, for their whole length.

Reads: the replica's ``kv_tokens`` and counted runs (``Replica.kv_runs``, ``Replica.kv_used``),
the run's ``prefix_tokens`` and finished turns, the callers' learned first-turn and growth sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica

FILL = 0.9
"""Share of a replica's KV pool that counted runs may claim (the rest: the engine's own reserve
for decoding and the estimates' error)."""
DEFAULT_GROWTH = 512
"""Tokens a run's context grows by per turn before any turn of its caller has shown it."""
FIRST_SHARE = 8
"""Before any run has shown its first turn's size, a run is counted at its replica's pool over
this (so a flood's first burst starts this many runs per replica, not as many as there are slots:
with 32k-token contexts a burst of 13 runs into a 236k-token pool thrashed for two minutes)."""
WEIGHT = 0.2
"""Weight of the newest sample in a caller's moving means (first-turn size, growth)."""
PARK_DEFAULT_S = 10.0
"""A counted run paused on a tool this long is parked while its caller has shown too few pauses."""
PARK_MIN_S = 1.0
"""A counted run is never parked before its pause is this long."""
PARK_SAMPLES = 8
"""Pauses its caller must have shown before they size when a run is parked."""


@dataclass(frozen=True, slots=True)
class KvAdmission:
    """The admission's settings: ``fill`` (:data:`FILL`); ``on`` False counts nothing (slots only,
    for measuring what it gains)."""

    on: bool = True
    fill: float = FILL

    def __post_init__(self) -> None:
        if not 0 < self.fill <= 1:
            raise ValueError(f"fill must be in (0, 1], got {self.fill}")


def learn(mean: float | None, sample: float) -> float:
    """A moving mean after one more ``sample`` (tokens)."""
    return sample if mean is None else WEIGHT * sample + (1 - WEIGHT) * mean


def run_tokens(
    prefix_tokens: int, finished_turns: int, first: float | None, growth: float | None, pool: int | None
) -> int:
    """What a run will hold in its replica's pool once its next turn ends (tokens): its last
    finished turn's prompt and completion (``prefix_tokens``), or while none finished (``finished_turns``
    0) the learned first turn ``first`` (else the replica's ``pool`` over :data:`FIRST_SHARE`, 0
    when that is unknown too), plus ``growth`` (else :data:`DEFAULT_GROWTH`)."""
    step = DEFAULT_GROWTH if growth is None else growth
    if finished_turns > 0:
        return int(prefix_tokens + step)
    if first is None:
        first = 0 if pool is None else pool / FIRST_SHARE
    return int(first + step)


def park_after(caller_pauses: Sequence[float]) -> float:
    """Seconds into a tool pause after which a counted run is parked (see the module docstring):
    twice the third quartile of its caller's recent pauses (``caller_pauses``, seconds), at least
    :data:`PARK_MIN_S`; :data:`PARK_DEFAULT_S` before :data:`PARK_SAMPLES` were seen."""
    if len(caller_pauses) < PARK_SAMPLES:
        return PARK_DEFAULT_S
    ordered = sorted(caller_pauses)
    return max(PARK_MIN_S, 2.0 * ordered[(3 * len(ordered)) // 4])


def fits(replica: Replica, need: int, settings: KvAdmission) -> bool:
    """True when a run counted at ``need`` tokens may start on ``replica`` (see the module
    docstring): its pool unknown, the admission off, no run counted there, room for it within
    ``fill`` of the pool, or nothing in flight there and room for it in the whole pool."""
    if not settings.on or replica.kv_tokens is None or replica.kv_used == 0:
        return True
    if replica.kv_used + need <= settings.fill * replica.kv_tokens:
        return True
    # nothing in flight: the slots would idle; take the run if the whole pool holds it
    return replica.inflight + replica.leased == 0 and replica.kv_used + need <= replica.kv_tokens
