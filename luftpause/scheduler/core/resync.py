"""Dataplanes coming and going (rules 10, 12 and 15 of :mod:`.decide`): a resync adopts what a
dataplane has in flight and releases what it no longer lists; a lost dataplane's grace."""

from __future__ import annotations

from collections.abc import Iterable

from luftpause.scheduler.core.actions import (
    AckResync,
    Action,
    Place,
)
from luftpause.scheduler.core.events import (
    DataplaneLost,
    Resynced,
)
from luftpause.scheduler.core.leasing import drop_leases
from luftpause.scheduler.core.placement import count_placed, fill_least_loaded, refile, reserve, touch
from luftpause.scheduler.core.state import PlacedTurn, Run, State


def lost(state: State, event: DataplaneLost) -> None:
    drop_leases(state, event.dataplane_id, False)  # its stream is gone, and its leases with it
    if event.dataplane_id and event.dataplane_id not in state.lost_dataplanes:
        # a second loss before any return keeps the first time: the grace runs from the first
        state.lost_dataplanes[event.dataplane_id] = event.at


def resynced(state: State, event: Resynced, out: list[Action]) -> None:
    if (event.runs or event.turns) and state.hold_until is not None and event.at < state.hold_until:
        state.holding = True  # a restart: the other dataplanes may not have resynced yet (rule 15)
    # a new stream: the leases of the old one are gone; fresh ones follow the acknowledgement
    drop_leases(state, event.dataplane_id, event.takes_leases and state.leasing)
    changed: dict[str, Run] = {}
    for record in event.runs:
        last_replica = record.last_replica or None
        run = state.runs.get(record.run_id)
        if run is None:
            run = Run(
                record.run_id,
                record.phase,
                last_replica,
                record.service_class,
                record.caller,
                event.at,
                order=state.next_seq,
            )
            state.runs[record.run_id] = run
        else:
            run.phase = record.phase
            run.last_replica = last_replica
            run.idle_at = None  # the record does not say when its last turn ended
            run.service_class = record.service_class
            run.caller = record.caller
            run.latest_turn = None
            touch(state, run, event.at)
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
            changed_run = release(state, known, event.at, recorded)
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
            trace_id=waiting.trace_id if waiting is not None else "",  # a resync carries none
        )
        replica.inflight += 1
        count_placed(state, turn.caller, 1, single_pass)
        state.counters.adopted += 1
        if waiting is not None:
            state.counters.held_adopted += 1
            out.append(Place(turn.turn_id, replica.name))  # its Admit is still waiting: answer it
        if single_pass:
            continue  # no run state
        run = state.runs.get(turn.run_id)
        if run is None:
            run = Run(
                turn.run_id,
                "generating",
                replica.name,
                turn.service_class,
                turn.caller,
                event.at,
                order=state.next_seq,
            )
            state.runs[turn.run_id] = run
        else:
            if run.run_id not in recorded:  # a turn in flight there means the run generates there
                run.phase = "generating"
                run.last_replica = replica.name
                run.idle_at = None
            touch(state, run, event.at)
        run.turns.add(turn.turn_id)
        run.latest_turn = turn.turn_id
        changed[run.run_id] = run

    if event.dataplane_id:
        state.lost_dataplanes.pop(event.dataplane_id, None)  # it is back: its view replaced ours
        gone = _unlisted(state, event, listed)
        state.counters.turns_released_resync += len(gone)
        for placed in gone:
            run = release(state, placed, event.at, recorded)
            if run is not None:
                changed[run.run_id] = run

    settle(state, changed.values(), event.at, out)
    out.append(AckResync(event.dataplane_id, len(recorded), len(listed)))


def _unlisted(state: State, event: Resynced, listed: set[str]) -> list[PlacedTurn]:
    return [
        placed
        for placed in state.placed.values()
        if placed.dataplane_id == event.dataplane_id
        and placed.turn_id not in listed
        and placed.turn_id not in event.pending  # its answer may be on the wire: it stands
    ]


def resync_gone_turns(state: State, event: Resynced) -> list[PlacedTurn]:
    """The placed turns ``event`` releases because its dataplane no longer lists them (rule 10):
    it lost them while its stream was down. A query, changing nothing (the shell logs them)."""
    if not event.dataplane_id:
        return []
    listed = {turn.turn_id for turn in event.turns if turn.replica in state.replicas}
    return _unlisted(state, event, listed)


def release(state: State, placed: PlacedTurn, at: float, recorded: set[str]) -> Run | None:
    """Drop ``placed``, which its dataplane no longer has (resync, rule 10; or lost, rule 9).

    Frees its slot; its run goes ``idle`` on that replica when it was the run's latest placed turn
    (as if it had failed, rule 6) unless the run is in ``recorded`` (the dataplane's own record of
    it stands). Returns the run it changed, whose headroom and held turns the caller must settle
    (:func:`settle`), or ``None``.
    """
    del state.placed[placed.turn_id]
    state.replicas[placed.replica].inflight -= 1
    count_placed(state, placed.caller, -1, placed.single_pass)
    run = state.runs.get(placed.run_id)
    if run is None or placed.turn_id not in run.turns:
        return None  # the run ended (or expired) since, or a single-pass turn: it changes no run
    run.turns.discard(placed.turn_id)
    if run.latest_turn in (None, placed.turn_id):
        run.latest_turn = None
        if run.run_id not in recorded:
            run.phase = "idle"
            run.last_replica = placed.replica
            run.idle_at = None  # as if it had failed: no prefix is known to be there
    touch(state, run, at)
    return run


def settle(state: State, changed: Iterable[Run], at: float, out: list[Action]) -> None:
    """After many runs and slots changed at once: headroom, re-filing, then every replica filled."""
    runs = list(changed)
    for run in runs:
        reserve(state, run, at)  # every replica is filled below
    for run in runs:
        refile(state, run.turns, at, out)
    fill_least_loaded(state, state.replicas.values(), at, out)
