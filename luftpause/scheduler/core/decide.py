"""``decide(state, event) -> (state, actions)``: every placement decision of the scheduler.

The rules, in the order they apply (DESIGN.md, "The scheduler"). Rules 1 to 12 are about generative
turns; single-pass turns follow rule 13, which says what of the others applies to them.

1. Model routing. A turn may go only to generative replicas that declare its model. A model that
   none declares is refused at once, ``Reject(turn, "no Generative replica serves model '<m>'",
   404)``; nothing is held or recorded. A known model whose replicas are all unhealthy waits. A
   generative turn never goes to a single-pass replica.
2. Health. ``ReplicaProbed`` records each replica's health and engine load. An unhealthy replica
   gets no turns; a replica never probed counts as healthy. When a replica's health flips, the held
   turns it concerns are re-filed (rule 4) and it is filled (rule 5).
3. Capacity. A replica has room for a turn when it is healthy and its placed turns are below its
   effective capacity: ``max_inflight`` while its engine reports no waiting queue (or no load at
   all), the engine's running count (at most ``max_inflight``) once a queue forms. Placed by
   ``Place`` (or adopted on resync) until ``TurnFinished``, ``TurnFailed``, ``TurnAbandoned``,
   ``AbandonReported``, expiry or a resync that no longer lists it. Headroom: a batch turn may not
   take the last free slots kept for interactive runs tool-paused on that replica, one per run. The
   rest are held.
4. Strict affinity. A run that is ``generating`` or ``tool_paused`` goes only to its last replica,
   even when another has room (unless that replica is unhealthy or does not serve the turn's
   model). An ``idle`` or new run may go anywhere: to the replica with the fewest placed turns among
   those with room for its class, ties in configuration order.
5. Held turns wait filed under their pinned replica or under their model, in order: interactive
   first, then the caller with the fewest placed turns, then arrival. When a slot frees (or a
   probe raises capacity, or headroom is released), the first held turn that may use it takes it;
   a turn pinned to a full replica never blocks turns that may go elsewhere. There is no deadline
   and no limit: a held turn leaves only when placed or abandoned. Hence the invariants: a held turn
   never waits while a replica it may use has room for its class, and an interactive turn is never
   held while a batch turn is placed on a replica it could use.
6. Run phases. Placed -> ``generating`` on that replica (its last replica). Finished with tool
   calls -> ``tool_paused``; finished without -> ``idle``; failed, abandoned after placement or
   expired -> ``idle``. The phase follows the run's latest placed turn: when turns of one run
   overlap, the end of an earlier one frees its slot and leaves the phase alone. Whenever a run
   changes, its held turns are re-filed under their new affinity (and placed at once if that lets
   them go somewhere with room). An interactive run entering ``tool_paused`` keeps one slot of its
   replica from batch turns until it leaves that phase, ends or expires.
7. ``TurnAbandoned`` (an Admit call cancelled): a held turn leaves its queue (no action); a placed
   one frees its slot. ``AbandonReported`` (the dataplane's ``TurnEvent.ABANDONED``, final): the same,
   except that a held turn's waiting Admit is answered ``Reject(turn, "turn was abandoned by its
   dataplane", 499)``; and the turn id, known or not, is remembered (a tombstone) so that an Admit for
   it arriving later is refused the same way at once, with nothing held or recorded. Tombstones are
   kept 120 s and at most 100,000 (the oldest forgotten first).
8. ``RunEnded``: the run is forgotten at once (``Forget``): its placed turns no longer change any
   run when they end, and its held turns (clients still wait for them) start it afresh, with no
   affinity.
9. ``Tick``: a placed turn with no completion after 600 s is dropped and its slot freed; a run with
   no held or placed turn and no activity for 1800 s is forgotten (``Forget``); tombstones older than
   120 s are dropped; a dataplane lost (rule 12) for ``dataplane_grace_s`` (60 s) or more is taken as
   gone for good: its placed turns are released as a resync that no longer lists them releases them
   (rule 10), counted in ``turns_released_lost_dataplane``, and it is no longer tracked.
10. ``Resynced``: a dataplane's runs (phase, last replica) and in-flight turns are adopted. The
   turns count against capacity (a turn id listed twice counts once) and put a run with no record
   of its own in ``generating`` there; a held turn that the dataplane says is already running is
   answered with its replica. Turns the scheduler had placed for that dataplane (non-empty id) that
   it neither lists nor names as pending (its Admit still out: the answer may cross the Resync on
   the wire) are gone and free their slots; a run the dataplane did not send a record of
   goes ``idle`` by rule 6 when the gone turn was its latest (the dataplane's own record of a run
   wins over what a stale turn implies). ``AckResync`` gives the counts.
11. A retried arrival of a placed turn is answered again with its replica; of a held turn, nothing
    (it is answered when placed); of a tombstoned turn, ``Reject`` with 499 (rule 7).
12. ``DataplaneLost`` (its last Connect stream ended; the shell sends it only for dataplanes that
    name themselves) starts its grace; a second loss keeps the first time. A ``Resynced`` for that
    id (the first message of its next stream) ends the loss; the shell counts a stream open from its
    resync on, so an old stream seen to end after the new one's resync is no loss. Held turns are
    left alone: a lost dataplane's Admits were cancelled with its stream (``TurnAbandoned``).

13. Single-pass turns (``TurnArrived.single_pass``: ``/v1/decide``, classifiers) go only to
    single-pass replicas that declare their model; a model none declares is refused at once,
    ``Reject(turn, "no SinglePass replica serves model '<m>'", 404)``, even when a generative
    replica serves it. They never touch run state: no run is created, changed or touched (phase,
    affinity, last replica, activity, headroom), whatever ``run_id`` they carry, and ``RunEnded``
    leaves them alone. They have no affinity: the least loaded single-pass replica with room (rules
    2 and 3: health, ``max_inflight`` and the engine-load cap apply the same way; headroom never
    does, since no run pauses there). Single-pass replicas take only single-pass turns, so the two
    kinds never count against each other's capacity. Held single-pass turns wait in their own
    queue per model, in the order of rule 5, the caller term counting the caller's placed
    single-pass turns; they are placed when a single-pass slot frees (an end, an abandon, expiry, a
    resync or a lost dataplane releasing one, a probe raising capacity or health). A resync adopts
    an in-flight turn on a single-pass replica as a single-pass turn (the replica's kind tells),
    and a retried, abandoned or tombstoned single-pass turn is answered as in rules 7 and 11.

14. Capacity leases (DESIGN.md, "Admission transport"; only with ``State.leasing``, the
    configuration's ``[scheduler] leases``). A dataplane that says so in its resync
    (``Resynced.takes_leases``, and a non-empty id) is a *lessee*. After every event the scheduler
    may grant each lessee slots of a generative replica, ``GrantLease(dataplane, replica, count,
    epoch, models)``: the dataplane then places a turn there at once, without asking, and reports it
    after (``LeasedTurnPlaced``). Leased slots count against capacity like placed turns
    (``Replica.leased``; rule 3's room is ``inflight + leased`` below the limit), so every other
    rule sees a leased slot as taken. What may be leased:
    * only a replica that is healthy, whose engine reports no queue (``waiting`` absent or 0) and
      for which no turn is held that it may take (its pinned queue and its models' queues: a turn
      pinned to another full replica cannot use it and does not stop it);
    * never more than its effective capacity less the headroom kept for tool-paused interactive
      runs (rule 3's limit for a batch turn) less its placed turns, so a batch turn placed under a
      lease never takes a kept slot; batch turns may use leases, since a lease exists only where no
      turn is held that could use the replica, so no interactive turn can be waiting for that slot;
    * shared between lessees evenly (the total of leased and free slots, split in lessee order).
    A lease is withdrawn, ``RevokeLease(dataplane, replica, epoch)`` (every unused slot of that
    replica, for that dataplane), as soon as any of this stops holding: a turn is held that the
    replica may take (then the replica is filled from its queues, rule 5, with the slots
    returned), a probe shows a queue, lower capacity or ill health, or headroom grows past what is
    free (then the lease is withdrawn and what is left granted afresh). Hence, after every event: no
    replica with a lease outstanding may take a held turn, and ``inflight + leased`` is within the
    batch limit wherever a lease is outstanding.
    Epochs: each (lessee, replica) holding has an epoch, new at every revocation (a counter of the
    whole state, so never reused); grants carry the current one, and a dataplane reports the epoch
    of the lease it used. ``LeasedTurnPlaced`` with the current epoch and a slot left takes that
    slot; one with an older epoch (or none left) crossed the revocation on the wire: the turn is
    already at its engine, so it stands as placed all the same, counted in ``lease_crossings``.
    The over-commit this allows is bounded by what was leased: a dataplane drops its unused slots
    when it reads the revocation, so the crossing turns of one revocation are at most its unused
    slots then; while they run, the replica counts them and gets neither placements nor leases past
    its limit. This is the one way a replica's placed turns may exceed its capacity (besides a
    resync, rule 10), and the one way a batch turn may be placed while an interactive turn waits for
    that replica.
    A turn that asks is placed where it would be with no lease out (rule 4's least loaded replica
    with room): if that replica's free slots are all leased, its leases are withdrawn first.
    A leased turn becomes a placed turn as by ``Place`` (rule 6: its run generates there, its
    other held turns re-filed; counted in ``admitted`` and in ``leased``); a turn id already placed
    is left as it is, and a held one (its Admit out too) is placed there and its Admit answered.
    Affinity (rule 4) is kept by the dataplane: it uses a lease for a run's turn only on the run's
    last replica while its own run table says the run generates or is tool-paused there, and for
    runs it does not know only by asking; a run whose turns come through several dataplanes may
    thus be placed off its last replica once, when one dataplane's record is stale (the scheduler
    takes the turn where it is, rule 6, and counts it in ``leased_off_affinity``). Lost and
    resynced dataplanes: ``DataplaneLost`` returns every slot leased to it; ``Resynced`` drops the
    dataplane's old leases (its new stream starts with none) and grants fresh ones if it takes
    leases. Turns placed under a lease whose report was lost with a stream are in its resync.
    Single-pass replicas are never leased (their turns always ask).

Report events about turns the scheduler does not hold placed (already expired, or never seen) are
ignored, except ``AbandonReported``, which leaves its tombstone. Event times are the shell's
monotonic seconds and never go backwards.

For speed, ``decide`` changes ``state`` in place and returns the same object: a caller that needs
the state before the event must copy it first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from luftpause.scheduler.core.actions import (
    AckResync,
    Action,
    Forget,
    GrantLease,
    Place,
    Reject,
    RevokeLease,
)
from luftpause.scheduler.core.events import (
    AbandonReported,
    DataplaneLost,
    Event,
    FirstToken,
    LeasedTurnPlaced,
    ReplicaProbed,
    ReplicasProbed,
    Resynced,
    RunEnded,
    RunPhase,
    Tick,
    TurnAbandoned,
    TurnArrived,
    TurnFailed,
    TurnFinished,
    TurnStarted,
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
    abandoned,
    affinity,
    capacity,
    engine_load,
    expiry,
    headroom,
    health,
    leases,
    least_loaded,
    lost_dataplane,
    ordering,
    routing,
)
from luftpause.scheduler.core.state import Lease, PlacedTurn, Replica, Run, State


def decide(state: State, event: Event) -> tuple[State, list[Action]]:
    """Apply ``event`` to ``state`` (in place) and say what the shell must do, in order."""
    out: list[Action] = []
    released = False
    if state.hold_until is None:
        state.hold_until = event.at + state.resync_hold_s
    elif state.holding and event.at >= state.hold_until:
        state.holding, released = False, True  # every replica is filled once this event is applied
    match event:
        case TurnArrived():
            _arrived(state, event, out)
        case TurnStarted():
            placed = state.placed.get(event.turn_id)
            if placed is not None and placed.started_at is None:
                placed.started_at = event.at
        case FirstToken():
            placed = state.placed.get(event.turn_id)
            if placed is not None and placed.first_token_at is None:
                placed.first_token_at = event.at
        case TurnFinished():
            phase: RunPhase = "tool_paused" if event.tool_calls else "idle"
            if _end_placed(state, event.turn_id, event.at, phase, out):
                state.counters.finished += 1
        case TurnFailed():
            if _end_placed(state, event.turn_id, event.at, "idle", out):
                state.counters.failed += 1
        case TurnAbandoned():
            _abandoned(state, event.turn_id, event.at, out)
        case AbandonReported():
            _abandon_reported(state, event, out)
        case RunEnded():
            _run_ended(state, event, out)
        case ReplicaProbed():
            _probed(state, (event,), event.at, out)
        case ReplicasProbed():
            _probed(state, event.probes, event.at, out)
        case Tick():
            _tick(state, event.at, out)
        case Resynced():
            _resynced(state, event, out)
        case DataplaneLost():
            _lost(state, event)
        case LeasedTurnPlaced():
            _leased(state, event, out)
    if released:
        _fill_least_loaded(state, state.replicas.values(), event.at, out)
    if state.lessees:
        _lease(state, event.at, out)
    return state, out


def _arrived(state: State, event: TurnArrived, out: list[Action]) -> None:
    placed = state.placed.get(event.turn_id)
    if placed is not None:
        out.append(Place(event.turn_id, placed.replica))
        return
    if event.turn_id in state.held:
        return
    if event.turn_id in state.tombstones:
        state.counters.rejected += 1
        out.append(Reject(event.turn_id, abandoned.ABANDONED_REASON, abandoned.ABANDONED_STATUS))
        return
    serving = routing.replicas_for(state, event.model, event.single_pass)
    if not serving:
        state.counters.rejected += 1
        reason = routing.unknown_model_reason(event.model, event.single_pass)
        out.append(Reject(event.turn_id, reason, routing.UNKNOWN_MODEL_STATUS))
        return
    state.counters.arrived += 1
    run = None if event.single_pass else _run_of_arrival(state, event, out)  # rule 13: no run state
    turn = HeldTurn(
        event.turn_id,
        event.run_id,
        event.model,
        event.service_class,
        event.caller,
        event.dataplane_id,
        event.at,
        state.next_seq,
        any_replica_for(event.model),
        event.single_pass,
    )
    state.next_seq += 1
    turn.queue, usable = _where(state, run, turn, serving)
    # where it would go with no lease out (rule 14: a lease gives way to a turn that asks)
    leased_taken = not state.lessees
    target = None
    if not state.holding:
        target = least_loaded.pick(capacity.with_room(usable, turn.service_class, leased_taken))
    if target is None:
        state.held.add(turn)
    else:
        if target.leased and not capacity.has_room(target, turn.service_class):
            _revoke(state, target, out)
        _place(state, turn, target, event.at, out)


def _run_of_arrival(state: State, event: TurnArrived, out: list[Action]) -> Run:
    """The run of an arriving generative turn, created or brought up to date; it now has the turn."""
    run = state.runs.get(event.run_id)
    if run is None:
        run = Run(event.run_id, "idle", None, event.service_class, event.caller, event.at)
        state.runs[event.run_id] = run
    else:
        run.service_class = event.service_class
        run.caller = event.caller
        _touch(state, run, event.at)
        released = _reserve(state, run)  # a paused run that comes back as batch keeps no slot
        if released is not None:
            _fill(state, released, event.at, out)
    run.turns.add(event.turn_id)
    return run


def _where(
    state: State, run: Run | None, turn: HeldTurn, serving: tuple[Replica, ...]
) -> tuple[QueueKey, tuple[Replica, ...]]:
    """The queue ``turn`` belongs in and the replicas it may use now (``serving``: routing's).

    A single-pass turn has no affinity (rule 13); a generative one is pinned by its run's (rule 4),
    unless the configuration turned strict affinity off (``State.strict_affinity``, for measuring
    what it gains).
    """
    if turn.single_pass or not state.strict_affinity:
        return (single_pass_for if turn.single_pass else any_replica_for)(turn.model), serving
    pinned = affinity.pinned_replica(run, serving)
    if pinned is not None:
        return pinned_to(pinned.name), (pinned,)
    return any_replica_for(turn.model), serving


def _place(
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
    )
    replica.inflight += 1
    _count_placed(state, turn.caller, 1, turn.single_pass)
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
        run = Run(turn.run_id, "generating", replica.name, turn.service_class, turn.caller, at)
        state.runs[turn.run_id] = run
    else:
        run.phase = "generating"
        run.last_replica = replica.name
        _touch(state, run, at)
        released = _reserve(state, run)
        if released is not None and released is not replica:
            # it came back elsewhere (its replica is unhealthy, or does not serve this model)
            _fill(state, released, at, out)
    run.turns.add(turn.turn_id)
    run.latest_turn = turn.turn_id
    _refile(state, run.turns, at, out)


def _refile(state: State, turn_ids: Iterable[str], at: float, out: list[Action]) -> None:
    """Re-file the held ones of ``turn_ids`` (generative: a run's) under their run's current affinity.

    Then each replica with room that a moved turn may now use is filled (:func:`_fill`, least
    loaded first), so no held turn waits while a replica it may use has room, and that room goes to
    the first turn in order of all that may use it: a batch turn that an ended run set free does
    not take the slot that an interactive turn pinned to that replica waits for.
    """
    opened: dict[str, Replica] = {}
    for turn_id in turn_ids:
        turn = state.held.get(turn_id)
        if turn is None:
            continue
        queue, usable = _where(
            state, state.runs.get(turn.run_id), turn, routing.replicas_for(state, turn.model)
        )
        if queue == turn.queue:
            continue  # same queue: it still waits for the same full replicas
        state.held.refile(turn, queue)
        for replica in capacity.with_room(usable, turn.service_class):
            opened[replica.name] = replica
    if opened:
        _fill_least_loaded(state, opened.values(), at, out)


def _fill(state: State, replica: Replica, at: float, out: list[Action]) -> None:
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
    queues = queues_served_by(replica.name, replica.kind, replica.models)
    loads = state.single_pass_inflight if replica.kind == "single_pass" else state.caller_inflight
    turn = ordering.first((state.held.head(queue) for queue in queues), loads)
    if turn is None or not capacity.has_room(replica, turn.service_class):
        return False
    state.held.remove(turn.turn_id)
    _place(state, turn, replica, at, out)
    return True


def _fill_least_loaded(state: State, replicas: Iterable[Replica], at: float, out: list[Action]) -> None:
    """Fill several replicas whose room opened at once, one turn at a time, least loaded first.

    Filling them one after the other would give the first every held turn that may go anywhere
    (a probe round that lifts two capped replicas: ``a: 22, b: 4``); a turn that may go anywhere
    goes where an arrival would have, to the replica with the fewest in-flight turns (ties in
    configuration order). A heap of ``(inflight, index)``; an entry whose count moved meanwhile
    (a placement inside the loop may fill another replica) is put back with the right one.
    """
    heap = [(replica.inflight, replica.index, replica.name) for replica in replicas]
    if len(heap) == 1:
        _fill(state, state.replicas[heap[0][2]], at, out)
        return
    heapq.heapify(heap)
    while heap and state.held:
        inflight, index, name = heapq.heappop(heap)
        replica = state.replicas[name]
        if replica.inflight != inflight:
            heapq.heappush(heap, (replica.inflight, index, name))
        elif _fill_one(state, replica, at, out):
            heapq.heappush(heap, (replica.inflight, index, name))


def _end_placed(state: State, turn_id: str, at: float, phase: RunPhase, out: list[Action]) -> bool:
    """A placed turn ended: free its slot, move its run to ``phase``; False if it was not placed."""
    placed = state.placed.pop(turn_id, None)
    if placed is None:
        return False
    replica = state.replicas[placed.replica]
    replica.inflight -= 1
    _count_placed(state, placed.caller, -1, placed.single_pass)
    run = state.runs.get(placed.run_id)
    # not a turn of a run that ended meanwhile, nor a single-pass turn (never one of a run's turns)
    if run is not None and turn_id in run.turns:
        run.turns.discard(turn_id)
        _touch(state, run, at)
        if run.latest_turn in (None, turn_id):
            run.latest_turn = None
            run.phase = phase
            run.last_replica = placed.replica
            released = _reserve(state, run)
            _refile(state, run.turns, at, out)
            if released is not None and released is not replica:
                _fill(state, released, at, out)
    _fill(state, replica, at, out)
    return True


def _abandoned(state: State, turn_id: str, at: float, out: list[Action]) -> bool:
    """Take back turn ``turn_id``: out of its queue, or off its slot; True if it was held."""
    turn = state.held.remove(turn_id)
    if turn is not None:
        state.counters.abandoned += 1
        state.counters.abandoned_held += 1
        run = None if turn.single_pass else state.runs.get(turn.run_id)
        if run is not None:
            run.turns.discard(turn.turn_id)
            _touch(state, run, at)
        return True
    if _end_placed(state, turn_id, at, "idle", out):
        state.counters.abandoned += 1
        state.counters.abandoned_placed += 1
    return False


def _abandon_reported(state: State, event: AbandonReported, out: list[Action]) -> None:
    # the Admit for this turn may still be on its way (or be retried): remember the id to refuse it
    state.tombstones[event.turn_id] = event.at
    state.tombstones.move_to_end(event.turn_id)
    while len(state.tombstones) > abandoned.MAX_TOMBSTONES:
        state.tombstones.popitem(last=False)
    if _abandoned(state, event.turn_id, event.at, out):
        # its Admit may still be waiting on the scheduler (the cancel has not arrived): answer it
        out.append(Reject(event.turn_id, abandoned.ABANDONED_REASON, abandoned.ABANDONED_STATUS))


def _run_ended(state: State, event: RunEnded, out: list[Action]) -> None:
    state.counters.runs_ended += 1
    out.append(Forget(event.run_id))
    run = state.runs.pop(event.run_id, None)
    if run is None:
        return
    released = _unreserve(state, run)
    if released is not None:
        _fill(state, released, event.at, out)
    held = [turn_id for turn_id in run.turns if turn_id in state.held]
    if held:
        # its held turns still have clients waiting: they start the run afresh, without affinity
        state.runs[run.run_id] = Run(
            run.run_id, "idle", None, run.service_class, run.caller, event.at, set(held)
        )
        _refile(state, held, event.at, out)


def _tick(state: State, now: float, out: list[Action]) -> None:
    # ``placed`` is in placement order and ``runs`` in order of last activity, so only the expired
    # front of each is visited.
    while state.placed:
        placed = next(iter(state.placed.values()))
        if not expiry.turn_expired(placed.placed_at, now):
            break
        _end_placed(state, placed.turn_id, now, "idle", out)
        state.counters.expired_turns += 1
    while state.runs:
        run = next(iter(state.runs.values()))
        if not expiry.run_expired(run.last_activity, now):
            break
        if run.turns:
            _touch(state, run, now)  # a run with a held or placed turn is active
            continue
        del state.runs[run.run_id]
        state.counters.expired_runs += 1
        out.append(Forget(run.run_id))
        released = _unreserve(state, run)
        if released is not None:
            _fill(state, released, now, out)
    while state.tombstones:
        turn_id, reported_at = next(iter(state.tombstones.items()))
        if not abandoned.tombstone_expired(reported_at, now):
            break
        del state.tombstones[turn_id]
    gone: set[str] = set()
    while state.lost_dataplanes:
        dataplane_id, lost_at = next(iter(state.lost_dataplanes.items()))
        if not lost_dataplane.gone_for_good(lost_at, now, state.dataplane_grace_s):
            break
        del state.lost_dataplanes[dataplane_id]
        gone.add(dataplane_id)
    if gone:
        # one pass in placement order, as a resync's gone turns (a scan, but once per lost dataplane)
        lost_turns = [placed for placed in state.placed.values() if placed.dataplane_id in gone]
        changed: dict[str, Run] = {}
        for placed in lost_turns:
            changed_run = _release(state, placed, now, set())
            if changed_run is not None:
                changed[changed_run.run_id] = changed_run
        state.counters.turns_released_lost_dataplane += len(lost_turns)
        _settle(state, changed.values(), now, out)


def _lost(state: State, event: DataplaneLost) -> None:
    _drop_leases(state, event.dataplane_id, False)  # its stream is gone, and its leases with it
    if event.dataplane_id and event.dataplane_id not in state.lost_dataplanes:
        # a second loss before any return keeps the first time: the grace runs from the first
        state.lost_dataplanes[event.dataplane_id] = event.at


def _resynced(state: State, event: Resynced, out: list[Action]) -> None:
    if (event.runs or event.turns) and state.hold_until is not None and event.at < state.hold_until:
        state.holding = True  # a restart: the other dataplanes may not have resynced yet (rule 15)
    # a new stream: the leases of the old one are gone; fresh ones follow the acknowledgement
    _drop_leases(state, event.dataplane_id, event.takes_leases and state.leasing)
    changed: dict[str, Run] = {}
    for record in event.runs:
        last_replica = record.last_replica or None
        run = state.runs.get(record.run_id)
        if run is None:
            run = Run(
                record.run_id, record.phase, last_replica, record.service_class, record.caller, event.at
            )
            state.runs[record.run_id] = run
        else:
            run.phase = record.phase
            run.last_replica = last_replica
            run.service_class = record.service_class
            run.caller = record.caller
            run.latest_turn = None
            _touch(state, run, event.at)
        changed[run.run_id] = run

    recorded = set(changed)
    listed: set[str] = set()
    for turn in event.turns:
        replica = state.replicas.get(turn.replica)
        if turn.turn_id in listed or replica is None:
            continue  # counted once; a replica not configured here cannot hold a slot
        listed.add(turn.turn_id)
        single_pass = replica.kind == "single_pass"  # rule 13: the replica's kind tells
        known = state.placed.get(turn.turn_id)
        if known is not None and known.single_pass != single_pass:
            # the dataplane has it on a replica of the other kind (its configuration differs): its
            # word wins; the turn leaves our record, and its run, and is adopted afresh below
            changed_run = _release(state, known, event.at, recorded)
            state.counters.turns_released_resync += 1
            if changed_run is not None:
                changed[changed_run.run_id] = changed_run
            known = None
        if known is not None:
            if known.replica != replica.name:
                state.replicas[known.replica].inflight -= 1
                replica.inflight += 1
                known.replica = replica.name
            known.dataplane_id = event.dataplane_id
            continue
        waiting = state.held.remove(turn.turn_id)
        if waiting is not None and not waiting.single_pass and single_pass:
            held_run = state.runs.get(waiting.run_id)
            if held_run is not None:
                held_run.turns.discard(waiting.turn_id)  # it is no turn of its run any more
        state.placed[turn.turn_id] = PlacedTurn(
            turn.turn_id,
            turn.run_id,
            turn.model,
            turn.service_class,
            turn.caller,
            event.dataplane_id,
            replica.name,
            event.at,
            single_pass=single_pass,
        )
        replica.inflight += 1
        _count_placed(state, turn.caller, 1, single_pass)
        state.counters.adopted += 1
        if waiting is not None:
            state.counters.held_adopted += 1
            out.append(Place(turn.turn_id, replica.name))  # its Admit is still waiting: answer it
        if single_pass:
            continue  # no run state
        run = state.runs.get(turn.run_id)
        if run is None:
            run = Run(turn.run_id, "generating", replica.name, turn.service_class, turn.caller, event.at)
            state.runs[turn.run_id] = run
        else:
            if run.run_id not in recorded:  # a turn in flight there means the run generates there
                run.phase = "generating"
                run.last_replica = replica.name
            _touch(state, run, event.at)
        run.turns.add(turn.turn_id)
        run.latest_turn = turn.turn_id
        changed[run.run_id] = run

    if event.dataplane_id:
        state.lost_dataplanes.pop(event.dataplane_id, None)  # it is back: its view replaced ours
        gone = [
            placed
            for placed in state.placed.values()
            if placed.dataplane_id == event.dataplane_id
            and placed.turn_id not in listed
            and placed.turn_id not in event.pending  # its answer may be on the wire: it stands
        ]
        state.counters.turns_released_resync += len(gone)
        for placed in gone:
            run = _release(state, placed, event.at, recorded)
            if run is not None:
                changed[run.run_id] = run

    _settle(state, changed.values(), event.at, out)
    out.append(AckResync(event.dataplane_id, len(recorded), len(listed)))


def _release(state: State, placed: PlacedTurn, at: float, recorded: set[str]) -> Run | None:
    """Drop ``placed``, which its dataplane no longer has (resync, rule 10; or lost, rule 9).

    Frees its slot; its run goes ``idle`` on that replica when it was the run's latest placed turn
    (as if it had failed, rule 6) unless the run is in ``recorded`` (the dataplane's own record of
    it stands). Returns the run it changed, whose headroom and held turns the caller must settle
    (:func:`_settle`), or ``None``.
    """
    del state.placed[placed.turn_id]
    state.replicas[placed.replica].inflight -= 1
    _count_placed(state, placed.caller, -1, placed.single_pass)
    run = state.runs.get(placed.run_id)
    if run is None or placed.turn_id not in run.turns:
        return None  # the run ended (or expired) since, or a single-pass turn: it changes no run
    run.turns.discard(placed.turn_id)
    if run.latest_turn in (None, placed.turn_id):
        run.latest_turn = None
        if run.run_id not in recorded:
            run.phase = "idle"
            run.last_replica = placed.replica
    _touch(state, run, at)
    return run


def _settle(state: State, changed: Iterable[Run], at: float, out: list[Action]) -> None:
    """After many runs and slots changed at once: headroom, re-filing, then every replica filled."""
    runs = list(changed)
    for run in runs:
        _reserve(state, run)  # every replica is filled below
    for run in runs:
        _refile(state, run.turns, at, out)
    _fill_least_loaded(state, state.replicas.values(), at, out)


def _probed(state: State, probes: Iterable[ReplicaProbed], at: float, out: list[Action]) -> None:
    """Apply a probe round (health, load, learned batch capacity), then fill what it opened."""
    probed: list[Replica] = []
    flipped: list[Replica] = []
    for event in probes:
        replica = state.replicas.get(event.replica)
        if replica is None:
            continue  # not configured here (a probe from an older configuration)
        turns_wait = bool(state.held) and _takes_held(state, replica)
        was_healthy = replica.healthy
        replica.healthy = event.healthy
        replica.probed_at = event.at
        replica.engine_running = event.running
        replica.engine_waiting = event.waiting
        replica.kv_usage = event.kv_usage
        replica.cache_hit_rate = event.cache_hit_rate
        replica.batch_capacity = engine_load.learn(
            replica.batch_capacity, event.healthy, event.running, event.waiting, turns_wait
        )
        probed.append(replica)
        if was_healthy != replica.healthy and replica.kind == "generative":
            flipped.append(replica)
    if flipped and state.held:
        # affinity to these replicas yields (or holds again): re-file the held turns they concern.
        # A scan of the held turns, but only when a replica's health flips.
        pinned = {pinned_to(replica.name) for replica in flipped}
        models = {model for replica in flipped for model in replica.models}
        concerned = [
            turn.turn_id
            for turn in state.held
            if turn.queue in pinned or (turn.queue[0] == "model" and turn.model in models)
        ]
        _refile(state, concerned, at, out)
    if probed:
        _fill_least_loaded(state, probed, at, out)


def _count_placed(state: State, caller: str, delta: int, single_pass: bool) -> None:
    """``caller`` has ``delta`` more placed turns of one kind; re-rank its held turns of that kind.

    Each kind counts apart (ordering policy, rule 13): the turns a caller has on one pool do not
    push back its turns held for the other.
    """
    loads = state.single_pass_inflight if single_pass else state.caller_inflight
    count = loads.get(caller, 0) + delta
    if count:
        loads[caller] = count
    else:
        loads.pop(caller, None)
    state.held.load_changed(caller, single_pass)


def _reserve(state: State, run: Run) -> Replica | None:
    """Keep ``run``'s headroom slot where its class and phase say; the replica that lost one, if any."""
    want = headroom.reserves(run.service_class, run.phase, run.last_replica)
    if want is not None and want not in state.replicas:
        want = None
    if want == run.reserved_on:
        return None
    released = _unreserve(state, run)
    if want is not None:
        state.replicas[want].reserved_for.add(run.run_id)
        run.reserved_on = want
    return released


def _unreserve(state: State, run: Run) -> Replica | None:
    """Give up ``run``'s headroom slot; the replica that held it, or ``None``."""
    if run.reserved_on is None:
        return None
    replica = state.replicas[run.reserved_on]
    replica.reserved_for.discard(run.run_id)
    run.reserved_on = None
    return replica


def _touch(state: State, run: Run, at: float) -> None:
    """Record activity of ``run`` at ``at``, keeping ``state.runs`` in order of last activity."""
    run.last_activity = at
    state.runs.move_to_end(run.run_id)


# -- capacity leases (rule 14) ---------------------------------------------------------------------


def _leased(state: State, event: LeasedTurnPlaced, out: list[Action]) -> None:
    """A dataplane placed a turn under a lease: it is placed there, whatever the lease says now."""
    replica = state.replicas.get(event.replica)
    if replica is None or replica.kind != "generative" or event.turn_id in state.placed:
        return  # not a replica of ours (a different configuration), or reported already
    holding = state.lessees.get(event.dataplane_id, {}).get(event.replica)
    if holding is not None and holding.epoch == event.epoch and holding.count > 0:
        holding.count -= 1
        replica.leased -= 1
    else:
        state.counters.lease_crossings += 1  # it crossed the revocation on the wire: it stands
    waiting = state.held.remove(event.turn_id)  # its Admit is out too (a dataplane of another make)
    run: Run | None
    if waiting is None:
        state.counters.arrived += 1
        arrival = TurnArrived(
            event.turn_id,
            event.run_id,
            event.model,
            event.service_class,
            event.caller,
            event.dataplane_id,
            event.at,
        )
        run = _run_of_arrival(state, arrival, out)
    else:
        run = state.runs.get(event.run_id)
    if state.strict_affinity:
        pinned = affinity.pinned_replica(run, routing.replicas_for(state, event.model))
        if pinned is not None and pinned is not replica:
            state.counters.leased_off_affinity += 1
    turn = HeldTurn(
        event.turn_id,
        event.run_id,
        event.model,
        event.service_class,
        event.caller,
        event.dataplane_id,
        event.at,
        state.next_seq,
        any_replica_for(event.model),
    )
    state.next_seq += 1
    _place(state, turn, replica, event.at, out, leased=True, answer=waiting is not None)
    state.placed[event.turn_id].started_at = event.at  # it went to its engine as it was placed


def _drop_leases(state: State, dataplane_id: str, takes_leases: bool) -> None:
    """Return every slot leased to ``dataplane_id``; it stays a lessee only if ``takes_leases``."""
    holdings = state.lessees.pop(dataplane_id, None)
    if holdings is not None:
        for name, holding in holdings.items():
            state.replicas[name].leased -= holding.count
    if takes_leases and dataplane_id:
        state.lessees[dataplane_id] = {}


def _lease(state: State, at: float, out: list[Action]) -> None:
    """After an event: withdraw the leases that no longer hold, give what that frees to the held
    turns (least loaded replica first, as an arrival would have been placed), then share out what
    may be leased. Afterwards no replica with a lease may take a held turn."""
    opened: list[Replica] = []
    for replica in state.replicas.values():
        if not replica.leased:
            continue
        takes_held = bool(state.held) and _takes_held(state, replica)
        if state.holding or takes_held or not leases.grantable(replica) or leases.room(replica) < 0:
            _revoke(state, replica, out)
            if takes_held:
                opened.append(replica)
    if opened:
        _fill_least_loaded(state, opened, at, out)
    if state.holding:
        return
    for replica in state.replicas.values():
        if not leases.grantable(replica) or (state.held and _takes_held(state, replica)):
            continue
        room = leases.room(replica)
        if room > 0:
            _grant(state, replica, room, out)


def _takes_held(state: State, replica: Replica) -> bool:
    """True when some held turn may go to ``replica`` (the head of a queue it serves)."""
    return any(
        state.held.head(queue) is not None
        for queue in queues_served_by(replica.name, replica.kind, replica.models)
    )


def _revoke(state: State, replica: Replica, out: list[Action]) -> None:
    for dataplane_id, holdings in state.lessees.items():
        holding = holdings.get(replica.name)
        if holding is None or holding.count == 0:
            continue  # every slot granted was reported used: nothing to withdraw
        replica.leased -= holding.count
        holding.count = 0
        holding.epoch = state.next_lease_epoch
        state.next_lease_epoch += 1
        state.counters.lease_revocations += 1
        out.append(RevokeLease(dataplane_id, replica.name, holding.epoch))


def _grant(state: State, replica: Replica, room: int, out: list[Action]) -> None:
    lessees = list(state.lessees.items())
    held = [holdings.get(replica.name) for _, holdings in lessees]
    wanted = leases.shares(room + replica.leased, [0 if h is None else h.count for h in held])
    for (dataplane_id, holdings), holding, want in zip(lessees, held, wanted, strict=True):
        give = min(want - (0 if holding is None else holding.count), room)
        if give <= 0:
            continue
        if holding is None:
            holding = holdings[replica.name] = Lease(0, state.next_lease_epoch)
            state.next_lease_epoch += 1
        holding.count += give
        replica.leased += give
        room -= give
        out.append(GrantLease(dataplane_id, replica.name, give, holding.epoch, replica.models))
