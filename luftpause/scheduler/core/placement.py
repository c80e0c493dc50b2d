"""Placing held turns (rules 4 to 6 of :mod:`.decide`): where a turn may go, putting it on a replica,
filling replicas whose room opened (least loaded first), re-filing held turns when their run
changes, and the bookkeeping every placement shares (callers' in-flight counts, headroom, activity).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from luftpause.scheduler.core.actions import (
    Action,
    Place,
)
from luftpause.scheduler.core.events import (
    ServiceClass,
    TurnArrived,
)
from luftpause.scheduler.core.held import (
    HeldTurn,
    QueueKey,
    any_replica_for,
    pinned_to,
    queues_served_by,
    single_pass_for,
)
from luftpause.scheduler.core.policies import (
    affinity,
    caller_tree,
    capacity,
    draining,
    headroom,
    health,
    idle_affinity,
    least_loaded,
    ordering,
    pause_hold,
    routing,
)
from luftpause.scheduler.core.state import PlacedTurn, Replica, Run, State, bound_callers


def run_of_arrival(state: State, event: TurnArrived, out: list[Action]) -> Run:
    """The run of an arriving generative turn, created or brought up to date; it now has the turn."""
    run = state.runs.get(event.run_id)
    if run is None:
        run = Run(
            event.run_id, "idle", None, event.service_class, event.caller, event.at, order=state.next_seq
        )
        state.runs[event.run_id] = run
    else:
        if run.phase == "tool_paused" and run.paused_at is not None and not run.returned:
            # it is back from its tool: how long that took teaches the hold of later pauses
            run.returned = True
            pause = event.at - run.paused_at
            pause_hold.remember(run.pauses, pause)
            pause_hold.remember(
                state.caller_pauses.setdefault(run.caller, []), pause, pause_hold.CALLER_HISTORY
            )
            bound_callers(state.caller_pauses, run.caller)
        run.service_class = event.service_class
        run.caller = event.caller
        touch(state, run, event.at)
        released = reserve(state, run, event.at)  # a paused run that comes back as batch keeps no slot
        if released is not None:
            fill(state, released, event.at, out)
    run.turns.add(event.turn_id)
    return run


def where(
    state: State, run: Run | None, turn: HeldTurn, serving: tuple[Replica, ...]
) -> tuple[QueueKey, tuple[Replica, ...], Replica | None]:
    """The queue ``turn`` belongs in, the replicas it may use now (``serving``: routing's) and the
    replica it prefers (its soft replica, or ``None``). Changes nothing.

    A single-pass turn has no affinity (rule 13); a generative one is pinned by its run's (rule 4),
    unless the configuration turned strict affinity off (``State.strict_affinity``, for measuring
    what it gains). A turn no affinity pins never goes to a draining replica (rule 16). A turn
    with a soft replica (``HeldTurn.soft``, :mod:`.policies.idle_affinity`) of an idle run may use
    only that one while its wait is not over; after, it prefers it.
    """
    fresh = tuple(replica for replica in serving if draining.takes_new_runs(replica))
    if turn.single_pass or not state.strict_affinity:
        return (single_pass_for if turn.single_pass else any_replica_for)(turn.model), fresh, None
    pinned = affinity.pinned_replica(run, serving)
    if pinned is not None:
        return pinned_to(pinned.name), (pinned,), None
    soft = None if turn.soft is None else idle_affinity.keeps(turn.soft, run, serving)
    if soft is not None and not turn.soft_over and idle_affinity.holds(state.idle_affinity):
        return pinned_to(soft.name), (soft,), soft
    return any_replica_for(turn.model), fresh, soft


def begin_soft_wait(state: State, run: Run, turn: HeldTurn, soft: Replica, at: float) -> None:
    """``turn`` arrived at ``at`` and is held for its soft replica ``soft``: its wait begins."""
    turn.soft_since = at
    rate = state.caller_cold_rates.get(run.caller)
    turn.soft_until = at + idle_affinity.wait_s(state.idle_affinity, run, rate, soft.inflight, at)
    heapq.heappush(state.soft_ends, (turn.soft_until, turn.seq, turn.turn_id))


def destination(
    usable: tuple[Replica, ...], soft: Replica | None, service_class: ServiceClass, leased_taken: bool
) -> Replica | None:
    """Where a turn that may use ``usable`` goes now: its soft replica when that has room, else the
    least loaded with room (rule 4), else ``None`` (it is held)."""
    if soft is not None and capacity.has_room(soft, service_class, leased_taken):
        return soft
    return least_loaded.pick(capacity.with_room(usable, service_class, leased_taken))


def place(
    state: State,
    turn: HeldTurn,
    replica: Replica,
    at: float,
    out: list[Action],
    leased: bool = False,
    answer: bool = True,
) -> None:
    """Put ``turn`` (not in the held queues) on ``replica``; its run now generates there.

    ``leased``: its dataplane placed it under a lease (counted apart); ``answer``: an Admit waits
    for it, answered with ``Place``.
    """
    state.placed[turn.turn_id] = PlacedTurn(
        turn.turn_id,
        turn.run_id,
        turn.model,
        turn.service_class,
        turn.caller,
        turn.dataplane_id,
        replica.name,
        at,
        single_pass=turn.single_pass,
        trace_id=turn.trace_id,
    )
    replica.inflight += 1
    count_placed(state, turn.caller, 1, turn.single_pass)
    state.counters.admitted += 1
    if leased:
        state.counters.leased += 1
    if answer:
        out.append(Place(turn.turn_id, replica.name))
    if turn.single_pass:
        return  # rule 13: no run state
    run = state.runs.get(turn.run_id)
    if run is None:
        # the run ended (RunEnded) while this turn was held: it starts afresh
        run = Run(
            turn.run_id, "generating", replica.name, turn.service_class, turn.caller, at, order=state.next_seq
        )
        state.runs[turn.run_id] = run
    else:
        run.phase = "generating"
        run.last_replica = replica.name
        run.idle_at = None
        touch(state, run, at)
        released = reserve(state, run, at)
        if released is not None and released is not replica:
            # it came back elsewhere (its replica is unhealthy, or does not serve this model)
            fill(state, released, at, out)
    run.turns.add(turn.turn_id)
    run.latest_turn = turn.turn_id
    refile(state, run.turns, at, out)


def refile(state: State, turn_ids: Iterable[str], at: float, out: list[Action]) -> None:
    """Re-file the held ones of ``turn_ids`` (generative: a run's) under their run's current affinity.

    Then each replica with room that a moved turn may now use is filled (:func:`fill`, least
    loaded first), so no held turn waits while a replica it may use has room, and that room goes to
    the first turn in order of all that may use it: a batch turn that an ended run set free does
    not take the slot that an interactive turn pinned to that replica waits for.
    """
    opened: dict[str, Replica] = {}
    for turn_id in turn_ids:
        turn = state.held.get(turn_id)
        if turn is None:
            continue
        run = state.runs.get(turn.run_id)
        serving = routing.replicas_for(state, turn.model)
        if (
            turn.soft is not None
            and not turn.soft_over
            and idle_affinity.keeps(turn.soft, run, serving) is None
        ):
            turn.soft_over = True  # its soft replica stopped taking it, or its run moved: for good
        queue, usable, _ = where(state, run, turn, serving)
        if queue == turn.queue:
            continue  # same queue: it still waits for the same full replicas
        state.held.refile(turn, queue)
        for replica in capacity.with_room(usable, turn.service_class):
            opened[replica.name] = replica
    if opened:
        fill_least_loaded(state, opened.values(), at, out)


def usability_changed(state: State, replicas: list[Replica], at: float, out: list[Action]) -> None:
    """``replicas`` turned usable or unusable (a probe, the breaker, a removal): affinity to the
    generative ones yields (or holds again), so the held turns they concern are re-filed. A scan
    of the held turns, but only when a replica's usability flips. The caller fills them."""
    flipped = [replica for replica in replicas if replica.kind == "generative"]
    if not flipped or not state.held:
        return
    pinned = {pinned_to(replica.name) for replica in flipped}
    models = {model for replica in flipped for model in replica.models}
    concerned = [
        turn.turn_id
        for turn in state.held
        if turn.queue in pinned or (turn.queue[0] == "model" and turn.model in models)
    ]
    refile(state, concerned, at, out)


def fill(state: State, replica: Replica, at: float, out: list[Action]) -> None:
    """Give ``replica``'s free slots to the first held turns (in order) that may use it."""
    while _fill_one(state, replica, at, out):
        pass


def _fill_one(state: State, replica: Replica, at: float, out: list[Action]) -> bool:
    """Give one free slot of ``replica`` to the first held turn (in order) that may use it.

    False when none was placed: no room, no held turn it serves, or the first one may not take a
    slot (a batch turn facing the headroom kept for paused interactive runs: every turn behind it
    in order is batch too).
    """
    if state.holding or not state.held or not health.usable(replica) or not capacity.has_room(replica):
        return False
    queues = queues_of(replica)
    if replica.kind == "single_pass":
        loads, roots = state.single_pass_inflight, state.single_pass_root_inflight
    else:
        loads, roots = state.caller_inflight, state.root_inflight
    turn = ordering.first((state.held.head(queue) for queue in queues), loads, roots)
    if turn is None or not capacity.has_room(replica, turn.service_class):
        return False
    state.held.remove(turn.turn_id)
    place(state, turn, replica, at, out)
    return True


def fill_least_loaded(state: State, replicas: Iterable[Replica], at: float, out: list[Action]) -> None:
    """Fill several replicas whose room opened at once, one turn at a time, least loaded first.

    Filling them one after the other would give the first every held turn that may go anywhere
    (a probe round that lifts two capped replicas: ``a: 22, b: 4``); a turn that may go anywhere
    goes where an arrival would have, to the replica with the fewest in-flight turns (ties in
    configuration order). A heap of ``(inflight, index)``; an entry whose count moved meanwhile
    (a placement inside the loop may fill another replica) is put back with the right one.
    """
    heap = [(replica.inflight, replica.index, replica.name) for replica in replicas]
    if len(heap) == 1:
        fill(state, state.replicas[heap[0][2]], at, out)
        return
    heapq.heapify(heap)
    while heap and state.held:
        inflight, index, name = heapq.heappop(heap)
        replica = state.replicas[name]
        if replica.inflight != inflight:
            heapq.heappush(heap, (replica.inflight, index, name))
        elif _fill_one(state, replica, at, out):
            heapq.heappush(heap, (replica.inflight, index, name))


def count_placed(state: State, caller: str, delta: int, single_pass: bool) -> None:
    """``caller`` (and so its root) has ``delta`` more placed turns of one kind; re-rank the held
    turns of that kind under its root (its own and its siblings').

    Each kind counts apart (ordering policy, rule 13): the turns a caller has on one pool do not
    push back its turns held for the other.
    """
    if single_pass:
        loads, roots = state.single_pass_inflight, state.single_pass_root_inflight
    else:
        loads, roots = state.caller_inflight, state.root_inflight
    count = loads.get(caller, 0) + delta
    if count:
        loads[caller] = count
    else:
        loads.pop(caller, None)
    top = caller_tree.root(caller)
    count = roots.get(top, 0) + delta
    if count:
        roots[top] = count
    else:
        roots.pop(top, None)
    state.held.load_changed(caller, single_pass, fell=delta < 0)


def reserve(state: State, run: Run, at: float) -> Replica | None:
    """Keep ``run``'s headroom slot where its class, phase and pause hold say; the replica that lost
    one, if any. A run entering ``tool_paused`` at ``at`` begins a pause: its hold's end is set then
    (:mod:`.policies.pause_hold`); a run leaving it ends the pause."""
    if run.phase == "tool_paused":
        if run.paused_at is None:
            run.paused_at = at
            run.returned = run.hold_expired = False
            run.hold_until = None
            if headroom.reserves(run.service_class, run.phase, run.last_replica) is not None:
                ttl = _pause_ttl(state, run)
                if ttl is not None and ttl <= 0:
                    run.hold_expired = True  # worth no slot at all
                elif ttl is not None:
                    run.hold_until = at + ttl
                    heapq.heappush(state.hold_ends, (run.hold_until, run.run_id, at))
    else:
        run.paused_at = run.hold_until = None
        run.returned = run.hold_expired = False
    want = None
    if pause_hold.holds(state.pause_hold) and not run.hold_expired:
        want = headroom.reserves(run.service_class, run.phase, run.last_replica)
    if want is not None and want not in state.replicas:
        want = None
    if want == run.reserved_on:
        return None
    released = unreserve(state, run)
    if want is not None:
        state.replicas[want].reserved_for.add(run.run_id)
        run.reserved_on = want
    return released


def _pause_ttl(state: State, run: Run) -> float | None:
    """The hold of ``run``'s pause beginning now (:func:`.policies.pause_hold.ttl`), from its own and
    its caller's pauses and the wait a slot of its replica saves."""
    replica = state.replicas.get(run.last_replica or "")
    saved = None
    if replica is not None:
        saved = pause_hold.saved_wait(replica.turn_s, capacity.limit(replica))
    return pause_hold.ttl(state.pause_hold, run.pauses, state.caller_pauses.get(run.caller, ()), saved)


def unreserve(state: State, run: Run) -> Replica | None:
    """Give up ``run``'s headroom slot; the replica that held it, or ``None``."""
    if run.reserved_on is None:
        return None
    replica = state.replicas[run.reserved_on]
    replica.reserved_for.discard(run.run_id)
    run.reserved_on = None
    return replica


def touch(state: State, run: Run, at: float) -> None:
    """Record activity of ``run`` at ``at``, keeping ``state.runs`` in order of last activity."""
    run.last_activity = at
    state.runs.move_to_end(run.run_id)


def queues_of(replica: Replica) -> list[QueueKey]:
    """The held queues ``replica`` takes turns from now: a draining one only its pinned runs'
    (rule 16: a single-pass one, none), any other every queue it serves."""
    if replica.draining:
        return [] if replica.kind == "single_pass" else [pinned_to(replica.name)]
    return queues_served_by(replica.name, replica.kind, replica.models)


def any_held_for(state: State, replica: Replica) -> bool:
    """True when some held turn may go to ``replica`` (the head of a queue it takes from)."""
    return any(state.held.head(queue) is not None for queue in queues_of(replica))
