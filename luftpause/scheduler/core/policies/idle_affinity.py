"""Soft affinity for idle runs: a run whose last turn just ended waits a bounded time for the replica
that holds its prefix before it may move.

Strict affinity (:mod:`.affinity`) pins only runs that are generating or paused on a tool call the
proxy saw. A run is ``idle`` between its turns whenever its replies carry no tool call the proxy can
see: a multi-turn chat (the user's next message), an agent that makes its tool rounds on text
replies (a model that never calls tools: SmolLM2-135M on llama.cpp), a harness whose tools the
proxy does not see. Such a run's next turn used to go to the least loaded replica with room, or,
held, to whichever replica freed a slot first, and lost its prefix on the replica it left
(bench/README.md, "REAL ENGINE": 38 % of prompt tokens from cache against the router's 65 %). On a
CPU engine the prefill of a prompt is most of a turn.

The rule (``mode="wait"``, the default): an idle run whose last turn *finished* (not failed,
abandoned or expired) on a replica at most :attr:`IdleAffinity.window_s` ago has that replica as
its *soft replica*, while the replica is usable, takes new runs (not draining) and serves the
turn's model. Its next turn goes there when it has room; when it has none the turn is held for that
replica alone for a bounded wait, then may go to any replica (it is re-filed on the first clock tick
at or after the wait's end). The wait is what a prefill miss would cost that run, learned from what
it cost the run before (after Continuum, arXiv 2511.02230, which pins a paused request's KV for a
TTL chosen from its reload cost against the queueing delay): the time from placement to first token
of the run's first turn (a prefill with nothing cached; a streamed turn's, since a whole answer
reports no first token), per prompt token, times the tokens its last
replica holds for it (its last turn's prompt and reply), times :attr:`IdleAffinity.factor`, within
``[min_s, max_s]``; the run's caller's last rate before the run has shown one, ``default_s`` before
either. Waiting longer than the miss would cost loses more than moving does.

Other modes, for measuring what the rule gains (bench/README.md): ``"off"`` (no soft affinity: the
rule before this policy), ``"prefer"`` (the soft replica when it has room, else any: never held
for it), ``"pin"`` (held for the soft replica until the window ends: hard affinity for that long,
where ``"wait"`` is soft, preferred, affinity).

A wait ends on the first clock tick at or after its end (the scheduler ticks every second), so a
wait of ``min_s`` lasts ``min_s`` to ``min_s`` + 1 s.

Reads: the run's phase, last replica, when its last turn finished (``Run.idle_at``), the tokens it
holds there (``Run.prefix_tokens``) and its cold prefill rate (``Run.cold_s_per_token``); the
caller's rate; the replica's health, draining flag and models; the event's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from luftpause.scheduler.core.policies import draining, health

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica, Run

IdleMode = Literal["off", "prefer", "wait", "pin"]
IDLE_MODES: tuple[IdleMode, ...] = ("off", "prefer", "wait", "pin")


@dataclass(frozen=True, slots=True)
class IdleAffinity:
    """The rule's settings (seconds); the defaults are the scheduler's."""

    mode: IdleMode = "wait"
    window_s: float = 300.0
    """An idle run whose last turn finished longer ago than this has no soft replica."""
    factor: float = 1.0
    """The wait, in prefill misses of the run."""
    min_s: float = 0.5
    max_s: float = 10.0
    default_s: float = 2.0
    """The wait before the run or its caller has shown a cold prefill."""
    shared: bool = False
    """``True``: the miss is counted once per turn sharing the soft replica's steps (its in-flight
    turns, plus the turn itself), for measuring. Off by default: the run's cold rate was measured
    under the load of its own first turn, so it already holds what sharing the steps cost then, and
    the soft replica is full whenever a wait begins, so the factor was always its largest
    (bench/README.md, "Idle affinity")."""

    def __post_init__(self) -> None:
        if self.mode not in IDLE_MODES:
            raise ValueError(
                f"idle affinity mode: expected one of {', '.join(IDLE_MODES)}, got {self.mode!r}"
            )
        for name in ("factor", "min_s", "max_s", "default_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"idle affinity {name}: expected a number > 0, got {getattr(self, name)!r}")
        if not self.window_s >= 0:
            raise ValueError(f"idle affinity window_s: expected a number >= 0, got {self.window_s!r}")
        if self.min_s > self.max_s:
            raise ValueError(
                f"idle affinity min_s: expected at most max_s ({self.max_s!r}), got {self.min_s!r}"
            )
        if not self.min_s <= self.default_s <= self.max_s:
            raise ValueError(
                f"idle affinity default_s: expected a number from min_s ({self.min_s!r}) to max_s "
                f"({self.max_s!r}), got {self.default_s!r}"
            )


def soft_replica(
    settings: IdleAffinity, run: Run | None, serving: tuple[Replica, ...], now: float
) -> Replica | None:
    """The soft replica of a turn of ``run`` arriving at ``now``, or ``None`` (any will do).

    Only an idle run whose last turn finished within the window has one: its last replica, while
    :func:`keeps` it.
    """
    if settings.mode == "off" or run is None or run.phase != "idle" or run.idle_at is None:
        return None
    if now - run.idle_at > settings.window_s or run.last_replica is None:
        return None
    return keeps(run.last_replica, run, serving)


def keeps(name: str, run: Run | None, serving: tuple[Replica, ...]) -> Replica | None:
    """Replica ``name`` while it may still be a soft replica for a turn of ``run``: it is the run's
    last replica, among ``serving`` (the replicas of the turn's model), usable and not draining;
    else ``None`` (the wait for it is over)."""
    if run is None or run.last_replica != name:
        return None
    for replica in serving:
        if replica.name == name:
            return replica if health.usable(replica) and draining.takes_new_runs(replica) else None
    return None


def holds(settings: IdleAffinity) -> bool:
    """Whether a turn whose soft replica is full is held for it (``wait``, ``pin``)."""
    return settings.mode in ("wait", "pin")


def wait_s(
    settings: IdleAffinity, run: Run, caller_rate: float | None, sharing: int = 0, now: float = 0.0
) -> float:
    """Seconds a turn of ``run`` arriving at ``now`` is held for its soft replica, whose steps
    ``sharing`` turns share now; under ``pin``, until the window since the run's last turn ends."""
    if settings.mode == "pin":
        idle_at = now if run.idle_at is None else run.idle_at
        return max(0.0, idle_at + settings.window_s - now)
    rate = run.cold_s_per_token if run.cold_s_per_token is not None else caller_rate
    if rate is None or run.prefix_tokens <= 0:
        return settings.default_s
    miss = rate * run.prefix_tokens * ((1 + max(0, sharing)) if settings.shared else 1)
    return min(settings.max_s, max(settings.min_s, settings.factor * miss))


def cold_rate(placed_at: float, first_token_at: float | None, prompt_tokens: int) -> float | None:
    """Seconds per prompt token from placement to first token of a run's first turn (its prefill
    with nothing cached), or ``None`` when the turn gave no first token or no prompt count."""
    if first_token_at is None or prompt_tokens <= 0:
        return None
    return max(0.0, first_token_at - placed_at) / prompt_tokens


def over(until: float | None, now: float) -> bool:
    """True when a wait that lasts until ``until`` (``None``: no end) is over at ``now``."""
    return until is not None and now >= until
