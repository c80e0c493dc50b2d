"""ThunderAgent's capacity scheduler (``--router tr``) in front of the pool, as its source decides.

From ``HaoKang-Timmy/ThunderAgent`` at 260e227 (``ThunderAgent/scheduler/router.py``,
``backend/state.py``, ``program/state.py``, ``app.py``), started as
``thunderagent --backend-type sglang --backends URL1,URL2 --router tr --metrics``, each request
naming its run as ``program_id``:

* **Programs.** Each run is a program, ``REASONING`` while a turn of it is in an engine (or waits
  to be let in), ``ACTING`` between turns (its tool runs). Its ``total_tokens`` is estimated
  before each turn from the request body (characters over a learned characters-per-token ratio;
  here the prompt's tokens, what the ratio converges to) and set to the usage's ``total_tokens``
  (prompt + completion) when the reply ends. The harness releases a program when its run ends
  (``POST /programs/release``).
* **Capacity** of a backend: its KV pool in tokens (``max_total_num_tokens`` of SGLang's server
  info) minus the tokens of the programs registered on it (reasoning ones plus
  ``--acting-token-weight`` (default 1.0) times acting ones, truncated to an integer:
  ``BackendState.active_program_tokens``) minus 100 per program (``BUFFER_PER_PROGRAM``). The
  ``shared_tokens`` term (prefix-cache savings) stays 0: nothing calls ``update_shared_tokens``.
* **A new program** (its first turn) is placed on the backend with the fewest active program
  tokens among those with room for it plus 100, if no program is paused; else it joins the global
  paused pool and waits. A program's later turns go to its backend (sticky), unless it is paused:
  then its turn waits until the scheduler resumes it.
* **The scheduler**, every ``--scheduler-interval`` (5 s): first *resume* (``_greedy_resume``):
  over the backends with more than 100 tokens of room, the paused programs in priority order
  (those with a turn waiting and past their first turn, then new programs, then acting ones; each
  group smallest ``total_tokens`` first) are taken while their tokens plus 100 each fit the room
  summed over backends; they are placed largest first on the backend with the most room at that
  moment (best fit decreasing), which may move a program to another backend than its own. Then,
  on each backend over capacity (room below 0), *pause* (``_pause_until_safe``): acting programs
  smallest first (unregistered, into the paused pool), then reasoning ones smallest first are
  *marked* (paused when their reply ends). Marking does not change the room the loop tests, so
  once no acting program is left every reasoning program of that backend is marked.
* No classes, no priorities: an interactive run is a program like any other.

The published code never resumes anything: ``_get_paused_programs_sorted`` returns ``(id, state,
info)`` tuples and ``_greedy_resume`` reads ``step_count`` from the tuple, so every scheduler tick
raises ``AttributeError`` (caught and logged) before resuming, and a paused program waits out
the 30-minute force-resume timeout. Modelled here is the fixed behaviour (the tuple unpacked, as
other public copies of the file have it): what the scheduler is meant to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.testkit.sim.arrangements import Arrangement
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import EnginePool, Usage
from luftpause.testkit.sim.workload import Run, Turn

SCHEDULER_INTERVAL_S = 5.0
BUFFER_PER_PROGRAM = 100
ACTING_TOKEN_WEIGHT = 1.0


@dataclass(slots=True, eq=False)
class Program:
    """One run as ThunderAgent tracks it (``program/state.py``'s ``Program``)."""

    program_id: str
    backend: int | None = None
    origin: int | None = None
    reasoning: bool = True
    paused: bool = False
    total_tokens: int = 0
    paused_tokens: int = 0
    """``total_tokens`` when it was paused (``PausedInfo.total_tokens``, the resume order's key)."""
    step_count: int = 0
    marked: bool = False
    waiting: Turn | None = None
    """Its turn held until it is resumed."""


class ThunderAgent(Arrangement):
    """ThunderAgent's ``tr`` router over ``pool`` (see the module docstring)."""

    name = "thunderagent"

    def __init__(
        self,
        clock: VirtualClock,
        pool: EnginePool,
        interval_s: float = SCHEDULER_INTERVAL_S,
        acting_token_weight: float = ACTING_TOKEN_WEIGHT,
    ) -> None:
        super().__init__(clock, pool)
        self.interval_s = interval_s
        self.acting_token_weight = acting_token_weight
        """``--acting-token-weight``: the share of an acting program's tokens counted against room."""
        self.capacity = [engine.profile.pool_tokens for engine in pool.engines]
        self.programs: dict[str, Program] = {}
        self.registered: list[dict[str, Program]] = [{} for _ in range(len(pool))]
        self.paused: dict[str, Program] = {}
        """The global paused pool, in the order programs joined it."""
        self.counts = {"paused": 0, "marked": 0, "resumed": 0, "migrated": 0, "queuedNew": 0}

    def start(self) -> None:
        self.clock.every(self.interval_s, self._scheduled_check)

    # --- a backend's room -----------------------------------------------------------------------

    def remaining(self, backend: int) -> int:
        """``remaining_capacity()``: the backend's KV pool less its programs' tokens and buffers, in
        tokens (below 0 when over capacity); acting programs count ``acting_token_weight`` of theirs."""
        programs = self.registered[backend].values()
        reasoning = sum(p.total_tokens for p in programs if p.reasoning)
        acting = sum(p.total_tokens for p in programs if not p.reasoning)
        active = int(reasoning + self.acting_token_weight * acting)
        return self.capacity[backend] - (active + BUFFER_PER_PROGRAM * len(programs))

    def _active_tokens(self, backend: int) -> float:
        return sum(p.total_tokens for p in self.registered[backend].values())

    # --- requests -------------------------------------------------------------------------------

    def send(self, turn: Turn, now: float) -> None:
        program = self.programs.get(turn.run.run_id)
        if program is None:
            program = self.programs[turn.run.run_id] = Program(turn.run.run_id)
        program.step_count += 1
        program.total_tokens = turn.prompt.tokens
        program.reasoning = True
        if program.paused:
            program.waiting = turn
            return
        if program.step_count == 1 and program.backend is None:
            backend = self._backend_for_new(program.total_tokens)
            if backend is None:
                program.waiting = turn
                self._to_paused_pool(program, origin=None)
                self.counts["queuedNew"] += 1
                return
            self._register(program, backend)
        assert program.backend is not None
        self.pool.submit(program.backend, turn, self)

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None:
        program = self.programs.get(turn.run.run_id)
        if program is not None:
            program.reasoning = False
            program.total_tokens = usage.prompt_tokens + usage.completion_tokens
            if program.marked:
                program.marked = False
                self._pause(program)
        super().finished(turn, replica, usage, now)

    def end_run(self, run: Run, now: float) -> None:
        program = self.programs.pop(run.run_id, None)
        if program is None:
            return
        self.paused.pop(run.run_id, None)
        if program.backend is not None:
            self.registered[program.backend].pop(run.run_id, None)

    # --- placement, pause and resume -------------------------------------------------------------

    def _backend_for_new(self, tokens: int) -> int | None:
        if self.paused:
            return None
        best: int | None = None
        for backend in range(len(self.pool)):
            if self.remaining(backend) < tokens + BUFFER_PER_PROGRAM:
                continue
            if best is None or self._active_tokens(backend) < self._active_tokens(best):
                best = backend
        return best

    def _register(self, program: Program, backend: int) -> None:
        program.backend = backend
        self.registered[backend][program.program_id] = program

    def _to_paused_pool(self, program: Program, origin: int | None) -> None:
        program.paused = True
        program.origin = origin
        program.paused_tokens = program.total_tokens
        self.paused[program.program_id] = program

    def _pause(self, program: Program) -> None:
        backend = program.backend
        if backend is None:
            return
        self.registered[backend].pop(program.program_id, None)
        program.backend = None
        self._to_paused_pool(program, origin=backend)
        self.counts["paused"] += 1

    def _scheduled_check(self) -> None:
        self._resume()
        for backend in range(len(self.pool)):
            if self.remaining(backend) < 0:
                self._pause_until_safe(backend)

    def _pause_until_safe(self, backend: int) -> None:
        while self.remaining(backend) < 0:
            programs = self.registered[backend].values()
            acting = sorted((p for p in programs if not p.reasoning), key=lambda p: p.total_tokens)
            if acting:
                self._pause(acting[0])
                continue
            reasoning = sorted(
                (p for p in programs if p.reasoning and not p.marked), key=lambda p: p.total_tokens
            )
            if not reasoning:
                return
            reasoning[0].marked = True
            self.counts["marked"] += 1

    def _resume(self) -> None:
        rooms = [
            (backend, room)
            for backend in range(len(self.pool))
            if (room := self.remaining(backend)) > BUFFER_PER_PROGRAM
        ]
        total = sum(room for _, room in rooms)
        if not rooms or not self.paused:
            return
        by_size = sorted(self.paused.values(), key=lambda p: p.paused_tokens)
        reasoning = [p for p in by_size if p.step_count != 1 and p.reasoning]
        new = [p for p in by_size if p.step_count == 1]
        acting = [p for p in by_size if p.step_count != 1 and not p.reasoning]
        chosen: list[Program] = []
        cumulative = 0
        for program in reasoning + new + acting:
            needed = program.total_tokens + BUFFER_PER_PROGRAM
            if cumulative + needed <= total:
                chosen.append(program)
                cumulative += needed
        if not chosen:
            return
        chosen.sort(key=lambda p: -p.total_tokens)
        rooms.sort(key=lambda item: -item[1])
        smallest = chosen[-1].total_tokens + BUFFER_PER_PROGRAM
        for program in chosen:
            if not rooms or smallest > rooms[0][1]:
                break
            needed = program.total_tokens + BUFFER_PER_PROGRAM
            if needed > rooms[0][1]:
                continue
            backend, room = rooms[0]
            self._resume_on(program, backend)
            left = room - needed
            if left > BUFFER_PER_PROGRAM:
                rooms[0] = (backend, left)
                rooms.sort(key=lambda item: -item[1])
            else:
                rooms.pop(0)

    def _resume_on(self, program: Program, backend: int) -> None:
        del self.paused[program.program_id]
        if program.origin is not None and program.origin != backend:
            self.counts["migrated"] += 1
        program.paused = False
        program.origin = None
        self._register(program, backend)
        self.counts["resumed"] += 1
        turn, program.waiting = program.waiting, None
        if turn is not None:
            self.pool.submit(backend, turn, self)

    def counters(self) -> dict[str, int]:
        return dict(self.counts)
