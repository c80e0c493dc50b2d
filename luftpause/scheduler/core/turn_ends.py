"""Turn and run ends (rules 6 to 9 of :mod:`.decide`): finished, failed, abandoned, run ended, expiry
and the release of a lost dataplane's turns on a tick."""

from __future__ import annotations

import heapq

from luftpause.scheduler.core.actions import (
    Action,
    Forget,
    Reject,
)
from luftpause.scheduler.core.events import (
    AbandonReported,
    RunEnded,
    RunPhase,
)
from luftpause.scheduler.core.placement import count_placed, fill, refile, reserve, touch, unreserve
from luftpause.scheduler.core.policies import (
    abandoned,
    expiry,
    idle_affinity,
    lost_dataplane,
    pause_hold,
)
from luftpause.scheduler.core.resync import release, settle
from luftpause.scheduler.core.state import PlacedTurn, Replica, Run, State, bound_callers


def end_placed(
    state: State,
    turn_id: str,
    at: float,
    phase: RunPhase,
    out: list[Action],
    finished: tuple[int, int] | None = None,
) -> bool:
    """A placed turn ended: free its slot, move its run to ``phase``; False if it was not placed.

    ``finished``: it finished (``TurnFinished``) with these ``(prompt, completion)`` tokens, so its
    replica holds its prefix (:mod:`.policies.idle_affinity`); ``None``: it failed, was abandoned or
    expired.
    """
    placed = state.placed.pop(turn_id, None)
    if placed is None:
        return False
    replica = state.replicas[placed.replica]
    replica.inflight -= 1
    if finished is not None and not placed.single_pass:
        replica.turn_s = pause_hold.learn_turn_time(replica.turn_s, at - placed.placed_at)
    count_placed(state, placed.caller, -1, placed.single_pass)
    run = state.runs.get(placed.run_id)
    # not a turn of a run that ended meanwhile, nor a single-pass turn (never one of a run's turns)
    if run is not None and turn_id in run.turns:
        run.attained_s += max(0.0, at - placed.placed_at)
        run.turns.discard(turn_id)
        touch(state, run, at)
        latest = run.latest_turn in (None, turn_id)
        if finished is not None:
            _learn_prefill(state, run, placed, finished, latest)
        if latest:
            run.latest_turn = None
            run.phase = phase
            run.last_replica = placed.replica
            run.idle_at = at if finished is not None and phase == "idle" else None
            released = reserve(state, run, at)
            refile(state, run.turns, at, out)
            if released is not None and released is not replica:
                fill(state, released, at, out)
    fill(state, replica, at, out)
    return True


def _learn_prefill(state: State, run: Run, placed: PlacedTurn, tokens: tuple[int, int], latest: bool) -> None:
    """A turn of ``run`` finished with ``tokens`` (prompt, completion): when it is the run's
    ``latest`` turn (whose replica becomes the run's last replica), what that replica holds for it;
    for its first, what a prefill with nothing cached costs it (:mod:`.policies.idle_affinity`)."""
    prompt, completion = tokens
    if latest:
        run.prefix_tokens = max(0, prompt) + max(0, completion)
    if run.finished_turns == 0:
        rate = idle_affinity.cold_rate(placed.placed_at, placed.first_token_at, prompt)
        if rate is not None:
            run.cold_s_per_token = rate
            state.caller_cold_rates[run.caller] = rate
            bound_callers(state.caller_cold_rates, run.caller)
    run.finished_turns += 1


def take_back(state: State, turn_id: str, at: float, out: list[Action]) -> bool:
    """Take back turn ``turn_id``: out of its queue, or off its slot; True if it was held."""
    turn = state.held.remove(turn_id)
    if turn is not None:
        state.counters.abandoned += 1
        state.counters.abandoned_held += 1
        run = None if turn.single_pass else state.runs.get(turn.run_id)
        if run is not None:
            run.turns.discard(turn.turn_id)
            touch(state, run, at)
        return True
    if end_placed(state, turn_id, at, "idle", out):
        state.counters.abandoned += 1
        state.counters.abandoned_placed += 1
    return False


def abandon_reported(state: State, event: AbandonReported, out: list[Action]) -> None:
    # the Admit for this turn may still be on its way (or be retried): remember the id to refuse it
    state.tombstones[event.turn_id] = event.at
    state.tombstones.move_to_end(event.turn_id)
    while len(state.tombstones) > abandoned.MAX_TOMBSTONES:
        state.tombstones.popitem(last=False)
    if take_back(state, event.turn_id, event.at, out):
        # its Admit may still be waiting on the scheduler (the cancel has not arrived): answer it
        out.append(Reject(event.turn_id, abandoned.ABANDONED_REASON, abandoned.ABANDONED_STATUS))


def run_ended(state: State, event: RunEnded, out: list[Action]) -> None:
    state.counters.runs_ended += 1
    out.append(Forget(event.run_id))
    run = state.runs.pop(event.run_id, None)
    if run is None:
        return
    released = unreserve(state, run)
    if released is not None:
        fill(state, released, event.at, out)
    held = [turn_id for turn_id in run.turns if turn_id in state.held]
    if held:
        # its held turns still have clients waiting: they start the run afresh, without affinity
        state.runs[run.run_id] = Run(
            run.run_id, "idle", None, run.service_class, run.caller, event.at, set(held), order=state.next_seq
        )
        refile(state, held, event.at, out)


def expiring_turns(state: State, now: float) -> list[PlacedTurn]:
    """The placed turns a ``Tick`` at ``now`` (seconds, the shell's clock) expires, oldest first.

    A query, changing nothing: the shell asks it before feeding the tick, to log each expired turn
    with its trace id (the tick's actions do not name them). ``placed`` is in placement order, so
    only its expired front is visited; turns the tick places meanwhile are placed at ``now``.
    """
    expired = []
    for placed in state.placed.values():
        if not expiry.turn_expired(placed.placed_at, now):
            break
        expired.append(placed)
    return expired


def dataplanes_gone_for_good(state: State, now: float) -> list[str]:
    """The lost dataplanes whose grace (``State.dataplane_grace_s``) a ``Tick`` at ``now`` ends,
    in the order they were lost: their placed turns are released (rule 9). A query."""
    gone = []
    for dataplane_id, lost_at in state.lost_dataplanes.items():
        if not lost_dataplane.gone_for_good(lost_at, now, state.dataplane_grace_s):
            break
        gone.append(dataplane_id)
    return gone


def turns_on(state: State, dataplane_ids: set[str]) -> list[PlacedTurn]:
    """The placed turns of the dataplanes ``dataplane_ids``, in placement order (a scan: asked once
    per dataplane given up, never per turn)."""
    return [placed for placed in state.placed.values() if placed.dataplane_id in dataplane_ids]


def tick(state: State, now: float, out: list[Action]) -> None:
    # first the waits for soft replicas that are over: the slots this tick frees may go to them
    _end_soft_waits(state, now, out)
    # ``runs`` is in order of last activity, so only its expired front is visited (as ``placed``'s).
    for placed in expiring_turns(state, now):
        end_placed(state, placed.turn_id, now, "idle", out)
        state.counters.expired_turns += 1
    while state.runs:
        run = next(iter(state.runs.values()))
        if not expiry.run_expired(run.last_activity, now, state.run_expiry_s):
            break
        if run.turns:
            touch(state, run, now)  # a run with a held or placed turn is active
            continue
        del state.runs[run.run_id]
        state.counters.expired_runs += 1
        out.append(Forget(run.run_id))
        released = unreserve(state, run)
        if released is not None:
            fill(state, released, now, out)
    _end_expired_holds(state, now, out)
    while state.tombstones:
        turn_id, reported_at = next(iter(state.tombstones.items()))
        if not abandoned.tombstone_expired(reported_at, now):
            break
        del state.tombstones[turn_id]
    gone = dataplanes_gone_for_good(state, now)
    for dataplane_id in gone:
        del state.lost_dataplanes[dataplane_id]
    if gone:
        lost_turns = turns_on(state, set(gone))
        changed: dict[str, Run] = {}
        for placed in lost_turns:
            changed_run = release(state, placed, now, set())
            if changed_run is not None:
                changed[changed_run.run_id] = changed_run
        state.counters.turns_released_lost_dataplane += len(lost_turns)
        settle(state, changed.values(), now, out)


def _end_expired_holds(state: State, now: float, out: list[Action]) -> None:
    """End the pause holds due by ``now`` (:mod:`.policies.pause_hold`): their runs keep no slot
    for the rest of the pause, and the slots of those that kept one are given back.

    ``hold_ends`` is a heap of every hold begun, by its end; an entry of a pause that is over (the
    run went on, or was forgotten) is dropped when it comes up.
    """
    freed: dict[str, Replica] = {}
    heap = state.hold_ends
    while heap and pause_hold.expired(heap[0][0], now):
        _, run_id, paused_at = heapq.heappop(heap)
        run = state.runs.get(run_id)
        if run is None or run.paused_at != paused_at or run.hold_expired:
            continue
        run.hold_expired = True
        released = unreserve(state, run)
        if released is not None:
            freed[released.name] = released
    for replica in freed.values():
        fill(state, replica, now, out)


def _end_soft_waits(state: State, now: float, out: list[Action]) -> None:
    """End the waits for soft replicas due by ``now`` (:mod:`.policies.idle_affinity`): those turns
    may go to any replica from now on, and are re-filed (and placed where there is room).

    ``soft_ends`` is a heap of every wait begun, by its end; an entry of a turn no longer
    held (placed, abandoned) or whose wait was over already is dropped when it comes up.
    """
    heap = state.soft_ends
    due: list[str] = []
    while heap and idle_affinity.over(heap[0][0], now):
        until, _, turn_id = heapq.heappop(heap)
        turn = state.held.get(turn_id)
        if turn is None or turn.soft_over or turn.soft_until != until:
            continue
        turn.soft_over = True
        due.append(turn_id)
    if due:
        refile(state, due, now, out)
