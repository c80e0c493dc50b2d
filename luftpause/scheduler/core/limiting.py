"""Protection limits (rule 18 of :mod:`.decide`, :mod:`.policies.limits`): refusing an arrival over
its holder's held-turn limit or token rate, refusing held turns past their queue timeout on a tick,
and draining the token buckets with the usage of finished turns. A caller's *holder* is the most
specific configured name of its lineage, else its root (:meth:`.policies.limits.Protection.holder`):
its turns count, and its bucket drains, for that name."""

from __future__ import annotations

from luftpause.scheduler.core.actions import Action, Reject
from luftpause.scheduler.core.events import ServiceClass, TurnArrived
from luftpause.scheduler.core.held import HeldTurn
from luftpause.scheduler.core.placement import touch, where
from luftpause.scheduler.core.policies import capacity, limits
from luftpause.scheduler.core.state import PlacedTurn, Replica, State

MAX_LIMITED_CALLERS = 1_000
"""Callers whose refusals are counted apart in ``State.limited_by_caller``; the rest under ``"*"``."""


def _count(state: State, caller: str, service_class: ServiceClass, reason: str) -> None:
    """Count one refusal by a limit, per caller (bounded) and per class and reason."""
    key = (
        caller
        if caller in state.limited_by_caller or len(state.limited_by_caller) < MAX_LIMITED_CALLERS
        else "*"
    )
    state.limited_by_caller[key] = state.limited_by_caller.get(key, 0) + 1
    by_reason = state.limited_by_class.setdefault(service_class, {})
    by_reason[reason] = by_reason.get(reason, 0) + 1


def refusal(state: State, event: TurnArrived, turn: HeldTurn, serving: tuple[Replica, ...]) -> Reject | None:
    """The 429 refusing ``event`` at once by its caller's token rate or held-turn limit, or ``None``.

    Judged before the arrival changes anything: ``turn`` is the turn it would hold, filed by its
    run's affinity as it stands. A refused arrival is counted in ``rejected`` and records nothing.
    """
    protection = state.protection
    if not protection.on:
        return None
    caller, service_class = event.caller, event.service_class
    holder = protection.holder(caller)
    these = protection.of(holder, service_class)
    if these.tokens_per_s is not None:
        bucket = state.buckets.get((holder, service_class))
        if bucket is not None:
            retry = limits.rate_retry_after(limits.refill(bucket, these, event.at), these)
            if retry is not None:
                state.counters.rejected += 1
                state.counters.limited_token_rate += 1
                _count(state, caller, service_class, "token_rate")
                reason = limits.rate_reason(holder, caller, service_class, these)
                return Reject(event.turn_id, reason, limits.LIMITED_STATUS, retry)
    if these.max_held is None:
        return None
    held = held_by(state, holder, service_class)
    if not limits.held_over(held, these):
        return None
    run = None if event.single_pass else state.runs.get(event.run_id)
    _, usable, _ = where(state, run, turn, serving)
    if not state.holding and capacity.with_room(usable, service_class, not state.lessees):
        return None  # it is placed at once: it would not be held
    state.counters.rejected += 1
    state.counters.limited_held += 1
    _count(state, caller, service_class, "held")
    reason = limits.held_reason(holder, caller, service_class, held, these)
    return Reject(event.turn_id, reason, limits.LIMITED_STATUS, limits.RETRY_AFTER_S)


def held_by(state: State, holder: str, service_class: ServiceClass) -> int:
    """The turns of ``service_class`` held for ``holder`` (a name :meth:`~.policies.limits.
    Protection.holder` gives): those of every caller under it, less those under the configured
    names below it that hold their own limits."""
    held = state.held.count(holder, service_class)
    for name in state.protection.carved(holder):
        held -= state.held.count(name, service_class)
    return held


def spend(state: State, placed: PlacedTurn, tokens: int, at: float) -> None:
    """A placed turn finished having used ``tokens`` (prompt and completion): its holder's bucket
    for its class is drained by them, when that pair has a token rate."""
    protection = state.protection
    if not protection.on or tokens <= 0:
        return
    holder = protection.holder(placed.caller)
    these = protection.of(holder, placed.service_class)
    if these.tokens_per_s is None:
        return
    key = (holder, placed.service_class)
    bucket = state.buckets.get(key)
    if bucket is None:
        if len(state.buckets) >= limits.MAX_BUCKETS:
            del state.buckets[next(iter(state.buckets))]  # the oldest; it forgets a debt at worst
        bucket = state.buckets[key] = limits.Bucket(these.burst, at)
    else:
        limits.refill(bucket, these, at)
    bucket.level -= tokens


def time_out(state: State, now: float, out: list[Action]) -> None:
    """On a tick: refuse (429) every held turn past its queue timeout; prune full token buckets."""
    protection = state.protection
    if not protection.on:
        return
    shortest = protection.shortest_timeout_s
    if shortest is not None and state.held:
        due: list[HeldTurn] = []
        for turn in state.held:  # arrival order: nothing younger than the shortest timeout is due
            if now - turn.arrived_at < shortest:
                break
            if limits.timed_out(turn.arrived_at, now, protection.of(turn.caller, turn.service_class)):
                due.append(turn)
        for turn in due:
            state.held.remove(turn.turn_id)
            state.counters.held_timed_out += 1
            _count(state, turn.caller, turn.service_class, "queue_timeout")
            run = None if turn.single_pass else state.runs.get(turn.run_id)
            if run is not None:
                run.turns.discard(turn.turn_id)
                touch(state, run, now)
            these = protection.of(turn.caller, turn.service_class)
            reason = limits.timeout_reason(now - turn.arrived_at, these)
            out.append(Reject(turn.turn_id, reason, limits.LIMITED_STATUS, limits.RETRY_AFTER_S))
    if state.buckets:
        full = [
            key
            for key, bucket in state.buckets.items()
            if limits.refill(bucket, protection.of(*key), now) >= protection.of(*key).burst  # type: ignore[arg-type]
        ]
        for key in full:
            del state.buckets[key]
