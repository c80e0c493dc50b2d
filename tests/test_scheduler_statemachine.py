"""Random sequences of events through ``decide``, checked after every step (Hypothesis).

The machine drives arrivals from two dataplanes (known and unknown models, a small pool of runs so
that runs come back and even overlap), finishes with and without tool calls, failures, abandons of
held and placed turns (Admit cancelled, and reported ABANDONED by the dataplane, also for turn ids
never seen), Admits for turns reported abandoned, run ends, empty resyncs of one dataplane (its
placed turns are gone), dataplanes lost (their Report stream ended; their held Admits cancelled)
and returning (a new stream, or the resync), probes that flip replicas' health and report engine
load, and clock ticks that jump far enough for expiry. Beside the core it keeps its own record of
each run's phase and last replica, of replicas' health, of the abandoned turn ids and of the lost
dataplanes, built only from the events it sent and the actions it got back, and checks the core
against it:

* no replica ever has more placed turns than its configured capacity, nor, when a turn is placed
  on it, more than its effective capacity (engine load: the running count once a queue forms);
* every arrived turn is exactly one of held, placed, rejected or ended: never lost, never twice;
* a turn of a run that is generating or tool-paused is placed only on the run's last replica
  while that replica is healthy (affinity never broken to a healthy replica);
* a held turn never waits while a healthy replica it may use has room for its class (headroom:
  one slot per interactive run tool-paused there is kept from batch turns);
* no interactive turn is held while a batch turn is placed on a replica it could use;
* a turn reported abandoned is neither held nor placed, and its Admit is refused with 499 for as
  long as its tombstone lives (120 s, dropped by the next tick);
* after any tick, no turn placed for a dataplane lost for the grace (60 s) or more is in flight.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from luftpause.config import parse_config
from luftpause.scheduler.core import (
    AbandonReported,
    AckResync,
    Action,
    DataplaneLost,
    DataplaneReturned,
    Event,
    Forget,
    Place,
    Reject,
    ReplicaProbed,
    Resynced,
    RunEnded,
    Tick,
    TurnAbandoned,
    TurnArrived,
    TurnFailed,
    TurnFinished,
    decide,
    new_state,
)
from luftpause.scheduler.core.policies import engine_load

CONFIG = """
[[replicas]]
name = "a"
url = "http://127.0.0.1:1"
models = ["m1", "m2"]
max_inflight = 2

[[replicas]]
name = "b"
url = "http://127.0.0.1:2"
models = ["m1"]
max_inflight = 1

[[replicas]]
name = "c"
url = "http://127.0.0.1:3"
models = ["m2"]
max_inflight = 2

[[replicas]]
name = "s"
url = "http://127.0.0.1:4"
models = ["m1"]
kind = "single_pass"
max_inflight = 4
"""

MODELS = ["m1", "m2", "m3"]  # m3: no generative replica serves it
SERVING = {"m1": ("a", "b"), "m2": ("a", "c")}
RUNS = [f"r{i}" for i in range(6)]
DATAPLANES = ["dp", "dp2"]
ABANDONED = Reject("", "turn was abandoned by its dataplane", 499)  # turn id filled in per use
TOMBSTONE_S = 120.0
TURN_EXPIRY_S = 600.0
GRACE_S = 60.0  # the default dataplane_grace_s


class SchedulerMachine(RuleBasedStateMachine):
    """The core under random events, with a shadow of run phases and turn fates."""

    @initialize()
    def start(self) -> None:
        self.config = parse_config(CONFIG, "machine.toml")
        self.state = new_state(self.config)
        self.now = 0.0
        self.next_turn = 0
        self.turns: dict[str, tuple[str, str]] = {}  # turn -> (run, model)
        self.dataplane: dict[str, str] = {}  # turn -> the dataplane that sent it
        self.arrived: set[str] = set()
        self.rejected: set[str] = set()
        self.ended: set[str] = set()
        self.placed_on: dict[str, str] = {}  # every Place seen: turn -> replica
        # shadow of each run: (phase, last replica); absent = unknown or forgotten
        self.shadow: dict[str, tuple[str, str]] = {}
        self.latest: dict[str, str] = {}  # run -> its most recently placed turn
        self.orphans: set[str] = set()  # turns placed for a run that was forgotten since
        self.tombstones: dict[str, float] = {}  # turn ids reported abandoned -> when
        self.next_ghost = 0
        self.healthy = {name: True for name in self.state.replicas}
        self.batch: set[str] = set()  # turns that arrived as batch
        self.lost: dict[str, float] = {}  # dataplane -> when its Report stream ended, until it returns
        self.last_tick: float | None = None

    # -- feeding --------------------------------------------------------------------------------------

    def feed(self, event: Event) -> list[Action]:
        # in placement order, the order expiry visits them
        placed_at = {turn_id: placed.placed_at for turn_id, placed in self.state.placed.items()}
        before = list(placed_at)
        self.state, actions = decide(self.state, event)
        # turns that left the placed set on a tick expired: apply that to the shadow before the
        # placements the tick caused (a turn placed by the tick is not in ``before``); the tick
        # expires turns first, then releases those of dataplanes lost past the grace
        # (a resync likewise drops the placed turns its dataplane no longer lists, before it places)
        if isinstance(event, Tick | Resynced):
            gone = [turn_id for turn_id in before if turn_id not in self.state.placed]
            if isinstance(event, Tick):
                expired = [t for t in gone if event.at - placed_at[t] >= TURN_EXPIRY_S]
                gone = expired + [t for t in gone if t not in expired]
            for turn_id in gone:
                self.end_placed(turn_id, "idle")
        if isinstance(event, Tick):
            for turn_id, reported_at in list(self.tombstones.items()):
                if event.at - reported_at >= TOMBSTONE_S:
                    del self.tombstones[turn_id]
        for action in actions:
            if isinstance(action, Place):
                self.on_place(action)
                replica = self.state.replicas[action.replica]
                assert replica.inflight <= engine_load.capacity(replica), f"{replica.name} over capacity"
                if action.turn_id in self.batch:
                    self.no_interactive_waits_for(replica.name)
            elif isinstance(action, Reject) and action.http_status == 499:
                assert action.turn_id in self.tombstones
                assert action == Reject(action.turn_id, ABANDONED.reason, 499)
            elif isinstance(action, Reject):
                assert action.http_status == 404
                assert action.turn_id in self.turns
                self.rejected.add(action.turn_id)
            elif isinstance(action, Forget):
                self.shadow.pop(action.run_id, None)
                self.latest.pop(action.run_id, None)
                self.orphans.update(t for t in before if self.turns[t][0] == action.run_id)
        return actions

    def on_place(self, action: Place) -> None:
        turn_id = action.turn_id
        assert turn_id not in self.placed_on, f"{turn_id} placed twice"
        run_id, model = self.turns[turn_id]
        assert action.replica in SERVING[model], f"{model} placed on {action.replica}"
        phase, last = self.shadow.get(run_id, ("idle", ""))
        assert self.healthy[action.replica], f"{turn_id} placed on unhealthy {action.replica}"
        if phase in ("generating", "tool_paused") and last in SERVING[model] and self.healthy[last]:
            assert action.replica == last, f"affinity broken: {run_id} on {last}, not {action.replica}"
        self.placed_on[turn_id] = action.replica
        self.shadow[run_id] = ("generating", action.replica)
        self.latest[run_id] = turn_id

    def usable(self, turn_id: str) -> tuple[str, ...]:
        """The replicas a held turn may use now: its run's healthy last replica, else any serving."""
        run_id, model = self.turns[turn_id]
        phase, last = self.shadow.get(run_id, ("idle", ""))
        if phase != "idle" and last in SERVING[model] and self.healthy[last]:
            return (last,)
        return tuple(name for name in SERVING[model] if self.healthy[name])

    def room(self, name: str, batch: bool) -> bool:
        replica = self.state.replicas[name]
        kept = 0
        if batch:
            kept = sum(
                1
                for run in self.state.runs.values()
                if run.phase == "tool_paused"
                and run.last_replica == name
                and run.service_class == "interactive"
            )
        return replica.inflight < engine_load.capacity(replica) - kept

    def no_interactive_waits_for(self, name: str) -> None:
        for turn in self.state.held:
            if turn.service_class == "interactive":
                assert name not in self.usable(turn.turn_id), f"{turn.turn_id} held behind batch on {name}"

    def end_placed(self, turn_id: str, phase: str) -> None:
        """A placed turn ended; the run's phase follows only its latest placed turn."""
        run_id, _ = self.turns[turn_id]
        self.ended.add(turn_id)
        if turn_id in self.orphans:
            return
        if run_id in self.shadow and self.latest.get(run_id) in (None, turn_id):
            self.shadow[run_id] = (phase, self.placed_on[turn_id])
            self.latest.pop(run_id, None)

    # -- rules ----------------------------------------------------------------------------------------

    @rule(
        run=st.sampled_from(RUNS),
        model=st.sampled_from(MODELS),
        batch=st.booleans(),
        caller=st.sampled_from(["", "x", "y"]),
        dataplane=st.sampled_from(DATAPLANES),
    )
    def arrive(self, run: str, model: str, batch: bool, caller: str, dataplane: str) -> None:
        if dataplane in self.lost:  # a dataplane sends Admits only with its stream open
            return  # (an assume() here would throw away every example where one was lost)
        turn_id = f"t{self.next_turn}"
        self.next_turn += 1
        self.turns[turn_id] = (run, model)
        self.dataplane[turn_id] = dataplane
        self.arrived.add(turn_id)
        if batch:
            self.batch.add(turn_id)
        self.now += 0.5
        actions = self.feed(
            TurnArrived(turn_id, run, model, "batch" if batch else "interactive", caller, dataplane, self.now)
        )
        if model not in SERVING:
            assert [a for a in actions if a.turn_id == turn_id] == [  # type: ignore[union-attr]
                Reject(turn_id, f"no Generative replica serves model '{model}'", 404)
            ]

    @precondition(lambda self: bool(self.state.placed))
    @rule(pick=st.integers(0, 1000), tools=st.booleans())
    def finish(self, pick: int, tools: bool) -> None:
        turn_id = sorted(self.state.placed)[pick % len(self.state.placed)]
        self.now += 1.0
        self.end_placed(turn_id, "tool_paused" if tools else "idle")
        self.feed(TurnFinished(turn_id, self.now, "stop", tools, 10, 5))

    @precondition(lambda self: bool(self.state.placed))
    @rule(pick=st.integers(0, 1000))
    def fail(self, pick: int) -> None:
        turn_id = sorted(self.state.placed)[pick % len(self.state.placed)]
        self.now += 1.0
        self.end_placed(turn_id, "idle")
        self.feed(TurnFailed(turn_id, self.now, "engine gone"))

    @precondition(lambda self: bool(self.state.held) or bool(self.state.placed))
    @rule(pick=st.integers(0, 1000), held=st.booleans())
    def abandon(self, pick: int, held: bool) -> None:
        held_ids = sorted(turn.turn_id for turn in self.state.held)
        pool = held_ids if (held and held_ids) or not self.state.placed else sorted(self.state.placed)
        turn_id = pool[pick % len(pool)]
        self.now += 0.1
        was_held = turn_id in self.state.held
        if was_held:
            self.ended.add(turn_id)
        else:
            self.end_placed(turn_id, "idle")
        actions = self.feed(TurnAbandoned(turn_id, self.now))
        if was_held:
            assert actions == [], "a held turn leaving its queue frees nothing"

    @rule(pick=st.integers(0, 1000), which=st.sampled_from(["held", "placed", "ended", "never seen"]))
    def report_abandoned(self, pick: int, which: str) -> None:
        """The dataplane reports ABANDONED: for a held, a placed, an ended or a never seen turn."""
        pools = {
            "held": sorted(turn.turn_id for turn in self.state.held),
            "placed": sorted(self.state.placed),
            "ended": sorted(self.ended | self.rejected),
        }
        pool = pools.get(which) or []
        if pool:
            turn_id = pool[pick % len(pool)]
        else:
            turn_id = f"ghost{self.next_ghost}"  # an Admit that has not arrived (or never will)
            self.next_ghost += 1
        self.now += 0.1
        was_held = turn_id in self.state.held
        if was_held:
            self.ended.add(turn_id)
        elif turn_id in self.state.placed:
            self.end_placed(turn_id, "idle")
        self.tombstones[turn_id] = self.now
        actions = self.feed(AbandonReported(turn_id, self.now))
        if was_held:
            assert actions == [Reject(turn_id, ABANDONED.reason, 499)], "its waiting Admit is answered"

    @precondition(lambda self: bool(self.tombstones))
    @rule(pick=st.integers(0, 1000), run=st.sampled_from(RUNS))
    def admit_abandoned(self, pick: int, run: str) -> None:
        """An Admit crossed (or was retried after) its turn's ABANDONED report: refused at once."""
        turn_id = sorted(self.tombstones)[pick % len(self.tombstones)]
        run_id, model = self.turns.get(turn_id, (run, "m1"))
        self.now += 0.1
        actions = self.feed(TurnArrived(turn_id, run_id, model, "interactive", "", "dp", self.now))
        assert actions == [Reject(turn_id, ABANDONED.reason, 499)]

    @rule(dataplane=st.sampled_from(DATAPLANES))
    def resync_empty(self, dataplane: str) -> None:
        """The dataplane reconnects with nothing in flight: the turns placed for it are gone."""
        self.now += 0.1
        self.lost.pop(dataplane, None)
        actions = self.feed(Resynced(dataplane, self.now, (), ()))
        assert actions[-1] == AckResync(dataplane, 0, 0)
        # what is left of it was placed by this resync (a held turn whose Admit still waits)
        placed_now = {action.turn_id for action in actions if isinstance(action, Place)}
        for placed in self.state.placed.values():
            assert placed.dataplane_id != dataplane or placed.turn_id in placed_now

    @precondition(lambda self: len(self.lost) < len(DATAPLANES))
    @rule(pick=st.integers(0, 1), wait=st.sampled_from([None, 30.0, 59.9, 60.0, 120.0]))
    def lose_dataplane(self, pick: int, wait: float | None) -> None:
        """Its Report stream ends; its connection is gone, so its held Admits are cancelled too.

        A dataplane with placed turns is picked first, and the clock may tick ``wait`` seconds
        after (short of, at and past the grace): random ticks alone rarely find placed turns.
        """
        connected = [name for name in DATAPLANES if name not in self.lost]
        busy = {placed.dataplane_id for placed in self.state.placed.values()}
        connected.sort(key=lambda name: name not in busy)
        dataplane = connected[pick % len(connected)] if pick else connected[0]
        self.now += 0.1
        self.lost[dataplane] = self.now
        lost_at = self.now
        assert self.feed(DataplaneLost(dataplane, self.now)) == []
        for turn_id in sorted(t.turn_id for t in self.state.held if self.dataplane[t.turn_id] == dataplane):
            self.now += 0.1
            self.ended.add(turn_id)
            assert self.feed(TurnAbandoned(turn_id, self.now)) == []
        if wait is not None:
            self.now = lost_at + wait
            self.last_tick = self.now
            self.feed(Tick(self.now))

    @precondition(lambda self: bool(self.lost))
    @rule(pick=st.integers(0, 1))
    def dataplane_returns(self, pick: int) -> None:
        """A new Report stream of it opens (within the grace or too late)."""
        dataplane = sorted(self.lost)[pick % len(self.lost)]
        self.now += 0.1
        del self.lost[dataplane]
        assert self.feed(DataplaneReturned(dataplane, self.now)) == []

    @rule(run=st.sampled_from(RUNS))
    def run_ends(self, run: str) -> None:
        self.now += 0.1
        actions = self.feed(RunEnded(run, self.now))
        assert actions[0] == Forget(run)

    @rule(seconds=st.sampled_from([1.0, 30.0, 59.0, 60.0, 61.0, 120.0, 599.0, 600.0, 1800.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.last_tick = self.now
        self.feed(Tick(self.now))

    @rule(
        name=st.sampled_from(["a", "b", "c"]),
        healthy=st.booleans(),
        running=st.none() | st.integers(0, 3),
        waiting=st.none() | st.integers(0, 2),
    )
    def probe(self, name: str, healthy: bool, running: int | None, waiting: int | None) -> None:
        self.now += 0.1
        self.healthy[name] = healthy
        usage = None if running is None else 0.5
        self.feed(ReplicaProbed(name, self.now, healthy, running, waiting, usage, None))

    @rule()
    def report_unknown_turn(self) -> None:
        self.now += 0.1
        assert self.feed(TurnFinished("never-seen", self.now, "stop", False, 0, 0)) == []

    # -- invariants -----------------------------------------------------------------------------------

    @invariant()
    def no_replica_above_capacity(self) -> None:
        for replica in self.state.replicas.values():
            count = sum(1 for placed in self.state.placed.values() if placed.replica == replica.name)
            assert replica.inflight == count
            assert count <= replica.max_inflight, f"{replica.name}: {count} > {replica.max_inflight}"

    @invariant()
    def every_turn_has_exactly_one_fate(self) -> None:
        held = {turn.turn_id for turn in self.state.held}
        placed = set(self.state.placed)
        fates = [held, placed, self.rejected, self.ended]
        assert sum(len(f) for f in fates) == len(self.arrived), "a turn is lost or counted twice"
        assert set().union(*fates) == self.arrived
        assert len(self.state.held) == len(held)
        # a placed turn is where its Place said, and was placed exactly once
        for turn_id, placed_turn in self.state.placed.items():
            assert self.placed_on[turn_id] == placed_turn.replica

    @invariant()
    def runs_match_the_shadow(self) -> None:
        for run_id, (phase, last) in self.shadow.items():
            run = self.state.runs.get(run_id)
            assert run is not None, f"{run_id} forgotten without Forget"
            assert (run.phase, run.last_replica) == (phase, last)

    @invariant()
    def abandoned_turns_stay_gone(self) -> None:
        held = {turn.turn_id for turn in self.state.held}
        for turn_id in self.tombstones:
            assert turn_id not in held and turn_id not in self.state.placed
        assert set(self.state.tombstones) == set(self.tombstones)

    @invariant()
    def lost_dataplanes_hold_no_slots_past_the_grace(self) -> None:
        if self.last_tick is None:
            return
        for placed in self.state.placed.values():
            lost_at = self.lost.get(placed.dataplane_id)
            assert lost_at is None or self.last_tick - lost_at < GRACE_S, (
                f"{placed.turn_id} still in flight for {placed.dataplane_id}, lost at {lost_at}"
            )

    @invariant()
    def held_turn_never_waits_beside_room(self) -> None:
        for turn in self.state.held:
            for name in self.usable(turn.turn_id):
                batch = turn.turn_id in self.batch
                assert not self.room(name, batch), f"{turn.turn_id} held while {name} has room"

    @invariant()
    def headroom_matches_paused_interactive_runs(self) -> None:
        for name, replica in self.state.replicas.items():
            paused = {
                run.run_id
                for run in self.state.runs.values()
                if run.phase == "tool_paused"
                and run.last_replica == name
                and run.service_class == "interactive"
            }
            assert replica.reserved_for == paused


SchedulerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestScheduler = SchedulerMachine.TestCase
