"""``decide(state, event) -> (state, actions)``: every placement decision of the scheduler.

The rules, in the order they apply (docs/architecture.md "Rules"). Rules 1 to 12 are about generative
turns; single-pass turns follow rule 13, which says what of the others applies to them.

1. Model routing. A turn may go only to generative replicas that declare its model. A model that
   none declares is refused at once, ``Reject(turn, "no Generative replica serves model '<m>'",
   404)``; nothing is held or recorded. A known model whose replicas are all unhealthy waits. A
   generative turn never goes to a single-pass replica.
2. Health. ``ReplicaProbed`` records each replica's health and engine load. An unhealthy replica
   gets no turns; a replica never probed counts as healthy. When a replica's health flips, the held
   turns it concerns are re-filed (rule 4) and it is filled (rule 5).
3. Capacity. A replica has room for a turn when it is healthy and its placed turns are below its
   effective capacity: the engine's batch capacity learned from its probes, at most
   ``max_inflight``, or ``max_inflight`` while none is known (:mod:`.policies.engine_load`: a
   probe showing a queue sets it to the running count (while none is known, only a queue the probe
   before showed too, or one with the KV cache full or its usage not reported), one showing more
   running with no queue raises it to that, one showing it full with no queue while turns wait for
   the replica raises it by one; one showing fewer running, no queue and no turn waiting for the
   replica, ill health or a probe with no load forgets it). A drained queue thus does not reopen
   the replica to ``max_inflight`` while turns wait for it. A probe round (``ReplicasProbed``; a
   lone ``ReplicaProbed`` is a round of one) is applied whole, then the replicas it opened are
   filled least loaded first, one turn at a time, as every fill of several replicas at once is (a
   resync, a release, a withdrawn lease, a run re-filed). Placed by
   ``Place`` (or adopted on resync) until ``TurnFinished``, ``TurnFailed``, ``TurnAbandoned``,
   ``AbandonReported``, expiry or a resync that no longer lists it. Headroom: a batch turn may not
   take the last free slots kept for interactive runs tool-paused on that replica, one per run
   whose pause is within its hold (rule 6). The rest are held.
4. Strict affinity. A run that is ``generating`` or ``tool_paused`` goes only to its last replica,
   even when another has room (unless that replica is unhealthy or does not serve the turn's
   model). An ``idle`` or new run may go anywhere: to the replica with the fewest placed turns among
   those with room for its class, ties in configuration order.
5. Held turns wait filed under their pinned replica or under their model, in order: interactive
   first, then the root caller with the fewest placed turns (its own and its sub-callers': ``/``
   separates a caller from its sub-callers, ``team-a/job-7`` is under root ``team-a``,
   :mod:`.policies.caller_tree`), then, within a root, the caller with the fewest placed turns of
   its own, then the turn's rank, then arrival. Root callers thus share the pool fairly with each
   other and sub-callers their root's part among themselves: a caller key's holder that narrows its
   turns into many callers gets one root's share, not many. The
   rank (:mod:`.policies.run_order`, fixed when the turn arrives) is by default its run's start:
   among a caller's turns of one class, the run the scheduler saw first goes first, so a run in
   progress never waits for a run that started after it, a replica serves a few runs at a time and
   their prefixes stay in its cache (served turn by turn in arrival order, every run in progress
   interleaves with every other and a flood thrashes the prefix cache). When a slot frees (or a
   probe raises capacity, or headroom is released), the first held turn that may use it takes it;
   a turn pinned to a full replica never blocks turns that may go elsewhere. Without protection
   limits (rule 18, off by default) there is no deadline and no limit: a held turn leaves only
   when placed or abandoned. Hence the invariants: a held turn
   never waits while a replica it may use has room for its class, and an interactive turn is never
   held while a batch turn is placed on a replica it could use.
6. Run phases. Placed -> ``generating`` on that replica (its last replica). Finished with tool
   calls -> ``tool_paused``; finished without -> ``idle``; failed, abandoned after placement or
   expired -> ``idle``. The phase follows the run's latest placed turn: when turns of one run
   overlap, the end of an earlier one frees its slot and leaves the phase alone. Whenever a run
   changes, its held turns are re-filed under their new affinity (and placed at once if that lets
   them go somewhere with room). An interactive run entering ``tool_paused`` keeps one slot of its
   replica from batch turns until it leaves that phase, ends or expires, or its pause outlives its
   hold (:mod:`.policies.pause_hold`): each pause's hold lasts a TTL fixed when the pause begins,
   the one that maximizes the wait a return saves (its replica's mean turn time over its effective
   capacity, weighed ``worth`` slot-seconds a second) times the chance the run is back within it,
   less the slot-seconds kept idle, over its caller's last pauses (else the run's own); at most
   60 s, 10 s before any pause or finished turn was seen; a TTL of 0 keeps no slot at all. A
   pause's length is the time from its start to the arrival of the run's next turn.
   A pause that outlives its hold keeps no slot for the rest of that pause (the run keeps its
   affinity), so a session cut off in the middle of a tool call gives its slot back.
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
   no held or placed turn and no activity for 1800 s is forgotten (``Forget``); pause holds due end
   and their slots are given back (rule 6); tombstones older than
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
    queue per model, in the order of rule 5, the root and caller terms counting their placed
    single-pass turns (each pool counts apart); they are placed when a single-pass slot frees (an
    end, an abandon, expiry, a resync or a lost dataplane releasing one, a probe raising capacity
    or health). A resync adopts
    an in-flight turn on a single-pass replica as a single-pass turn (the replica's kind tells),
    and a retried, abandoned or tombstoned single-pass turn is answered as in rules 7 and 11.

14. Capacity leases (docs/architecture.md "Admission transport"; only with ``State.leasing``, the
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

15. Startup hold (``State.resync_hold_s``, the configuration's ``[scheduler] resync_hold_s``,
    2 s by default). The hold's window runs from the first event the scheduler sees for that many
    seconds. A ``Resynced`` inside the window that hands over runs or in-flight turns shows a
    restart: from then until the window ends no held turn is placed (arrivals are held, fills
    place nothing) and no lease is granted (outstanding ones are withdrawn), so that the other
    dataplanes may resync their in-flight turns before any replica is filled past its capacity.
    Answers for turns already running (a resync listing a held turn, a retried arrival of a placed
    one) are given as ever. The first event at or after the window's end (the 1 s tick) fills
    every replica, least loaded first. A fresh start (empty resyncs) is not held.

16. Replicas at run time (the admin API, ``SIGHUP``; :mod:`.policies.draining`). ``ReplicaAdded``
    joins a replica after every other (``index``), and its models' held turns may go there at once;
    a name already in the set is ignored. ``ReplicaDrained``: it takes no new run, only turns of
    runs pinned there by affinity (rule 4: a run coming back from its tool still goes there) until
    they end or move; its in-flight turns finish; it is never leased (its leases are withdrawn);
    a draining single-pass replica takes nothing. ``ReplicaRemoved``: it takes no turn at all (it
    counts as unusable, so affinity yields and runs pinned there move), and it leaves the set,
    ``RetireReplica(name)``, as soon as nothing is placed or leased there (at once when nothing
    was), so a removal lasts at most the turn expiry (600 s). Then no run keeps it as its last
    replica, and a replica added later under its name holds no prefix of theirs.
    ``ReplicaRestored``: back in rotation (ends a drain, or a removal not finished).
17. Circuit breaker (:mod:`.policies.breaker`, ``[scheduler.protection] breaker_*``; engine faults
    open none by default). Closed, the ``breaker_failures``-th turn to fail on a replica with an
    engine fault (``TurnFailed.engine_fault``; a client leaving mid-stream is none) within
    ``breaker_window_s`` and since its last finished turn opens it: out of rotation at once, before
    its slot is given to a held turn, as an unhealthy probe would (rule 2). A turn whose engine was
    never reached (``TurnFailed.unreachable``) opens it at once, whatever the threshold (even 0):
    the dataplane admits that turn again, and it must not go back there. Open, the first healthy
    probe ``breaker_open_s`` after it opened makes it half-open: usable, but with room only while
    fewer than ``breaker_trial_turns`` turns are in flight there (its trial turns; never leased).
    ``breaker_success_threshold`` turns finished there in a row close it (its full capacity is
    filled at once); a turn failing there with an engine fault, or an unhealthy probe, opens it
    again. Each transition is a ``BreakerChanged`` for the shell to log, counted per
    ``(replica, from, to)`` (``State.breaker_transitions``) and as ``breaker_trips`` (to open) and
    ``breaker_closes`` (to closed).
18. Protection limits (:mod:`.policies.limits`, ``[scheduler.protection]``, off by default), per
    caller and class, held by a name of the caller tree: a caller's limits are those of the most
    specific configured name among it and the callers above it, else the class defaults, and are
    counted for that name (its *holder*; with none configured, its root) over every caller under
    it but those under a configured name of their own, so narrowing never escapes a limit. An
    arrival that would be held while its holder has ``max_held`` turns of its class held, or whose
    holder's token bucket for its class holds less than one token, is refused at once,
    ``Reject(turn, reason, 429, retry_after_s)``, and records nothing (judged before the
    arrival changes its run; a turn placed at once is never refused by ``max_held``); a held turn
    ``queue_timeout_s`` old is refused the same way on the next tick. Buckets are drained by each
    finished turn's prompt and completion tokens. Refusals are counted (``limited_held``,
    ``limited_token_rate``: parts of ``rejected``; ``held_timed_out``: a fate of an arrived turn).

The code follows the rules: :mod:`.arrivals` (1, 4, 11, 13), :mod:`.placement` (4 to 6: where a
turn may go, placing, filling, re-filing), :mod:`.turn_ends` (6 to 9), :mod:`.probing` (2, 3),
:mod:`.resync` (10, 12, 15), :mod:`.leasing` (14), :mod:`.replica_set` (16), :mod:`.limiting` (18;
17 is in ``decide`` itself); the policies each rule composes are in
:mod:`.policies`.

Report events about turns the scheduler does not hold placed (already expired, or never seen) are
ignored, except ``AbandonReported``, which leaves its tombstone. Event times are the shell's
monotonic seconds and never go backwards.

For speed, ``decide`` changes ``state`` in place and returns the same object: a caller that needs
the state before the event must copy it first.
"""

from __future__ import annotations

from luftpause.scheduler.core.actions import Action
from luftpause.scheduler.core.arrivals import arrived
from luftpause.scheduler.core.events import (
    AbandonReported,
    DataplaneLost,
    Event,
    FirstToken,
    LeasedTurnPlaced,
    ReplicaAdded,
    ReplicaDrained,
    ReplicaProbed,
    ReplicaRemoved,
    ReplicaRestored,
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
from luftpause.scheduler.core.leasing import lease, leased
from luftpause.scheduler.core.limiting import spend, time_out
from luftpause.scheduler.core.placement import fill_least_loaded, usability_changed
from luftpause.scheduler.core.policies import breaker
from luftpause.scheduler.core.probing import apply_probes, breaker_changed
from luftpause.scheduler.core.replica_set import added, drained, removed, restored, retire_due
from luftpause.scheduler.core.resync import lost, resynced
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.turn_ends import abandon_reported, end_placed, run_ended, take_back, tick


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
            arrived(state, event, out)
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
            placed = state.placed.get(event.turn_id)
            closed = None
            if placed is not None:
                replica = state.replicas[placed.replica]
                change = breaker.finished(replica, state.protection.breaker)
                if change is not None:
                    closed = replica
                    breaker_changed(state, replica, change, out)
                spend(state, placed, event.prompt_tokens + event.completion_tokens, event.at)
            tokens = (event.prompt_tokens, event.completion_tokens)
            if end_placed(state, event.turn_id, event.at, phase, out, tokens):
                state.counters.finished += 1
            if closed is not None:  # its full capacity back: fill it
                fill_least_loaded(state, [closed], event.at, out)
        case TurnFailed():
            placed = state.placed.get(event.turn_id)
            tripped = None
            if placed is not None:
                replica = state.replicas[placed.replica]
                settings = state.protection.breaker
                change = breaker.failed(replica, event.engine_fault, event.at, settings, event.unreachable)
                if change is not None:
                    tripped = replica  # out of rotation before its slot is given to a held turn
                    change = breaker.Transition(
                        change.before, change.after, f"{change.reason}: {event.error}"
                    )
                    breaker_changed(state, replica, change, out)
            if end_placed(state, event.turn_id, event.at, "idle", out):
                state.counters.failed += 1
            if tripped is not None:
                usability_changed(state, [tripped], event.at, out)
        case TurnAbandoned():
            take_back(state, event.turn_id, event.at, out)
        case AbandonReported():
            abandon_reported(state, event, out)
        case RunEnded():
            run_ended(state, event, out)
        case ReplicaProbed():
            apply_probes(state, (event,), event.at, out)
        case ReplicasProbed():
            apply_probes(state, event.probes, event.at, out)
        case Tick():
            tick(state, event.at, out)
            time_out(state, event.at, out)
        case Resynced():
            resynced(state, event, out)
        case DataplaneLost():
            lost(state, event)
        case LeasedTurnPlaced():
            leased(state, event, out)
        case ReplicaAdded():
            added(state, event, out)
        case ReplicaDrained():
            drained(state, event, out)
        case ReplicaRestored():
            restored(state, event, out)
        case ReplicaRemoved():
            removed(state, event, out)
    if released:
        fill_least_loaded(state, state.replicas.values(), event.at, out)
    if state.lessees:
        lease(state, event.at, out)
    if state.removing:
        retire_due(state, event.at, out)
    return state, out
