"""Replaying a trace the scheduler recorded (:mod:`luftpause.scheduler.trace`) under any arrangement.

:func:`load_trace` reads the last scheduler start of a trace file into runs: each run's class,
caller, start, and per turn its prompt and completion tokens, whether it asked for tools, and the
pause before the next turn (the time from its finish to the next turn's arrival: the tool round as
the client ran it); and whether the run was ended (``DELETE /v1/runs/{id}``) or just stopped (a
session cut off mid tool call, or the trace's end).

:class:`Replay` drives a simulation with it as the agents of a flood do: each run starts when it
started in the trace (open loop between runs: a replay cannot know which later run an ended run's
client would have started), and inside a run the loop is closed: a turn is sent when the previous
one has finished *in the simulation* and its recorded pause has passed, so an arrangement that
serves turns sooner finishes runs sooner. The prompts are rebuilt from the token counts, as a run
grows: the first turn's prompt is one node; each next prompt is the last prompt, the last reply
and the rest of the new prompt's tokens (the tool results). Nothing of the prompts' text is
known, so no two runs share a prefix.

Raises :class:`TraceError` for a file that is not a trace (no header, a line that is not JSON).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from luftpause.testkit.engine.prefix_cache import PrefixPath
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.workload import AgentGroup, Run, ServiceClass, Sink, Turn


class TraceError(ValueError):
    """The file is not a scheduler trace; the message says where and why."""


@dataclass(frozen=True, slots=True)
class TracedTurn:
    """One turn of a traced run: its usage's tokens, whether it asked for tools, and the seconds from
    its end to the arrival of the run's next turn (``None`` for its last turn)."""

    prompt_tokens: int
    completion_tokens: int
    tools: bool
    pause_after: float | None


@dataclass(frozen=True, slots=True)
class TracedRun:
    run_id: str
    service_class: ServiceClass
    caller: str
    started_at: float
    turns: tuple[TracedTurn, ...]
    ended_after: float | None
    """Seconds from its last turn's end to its ``run_ended``; ``None``: never ended."""


@dataclass(frozen=True, slots=True)
class Trace:
    """The runs of one scheduler start, as a replay's load: ``groups`` per (class, caller), with as
    many agents as that group had runs at once at most; ``duration_s``: the trace's span."""

    runs: tuple[TracedRun, ...]
    duration_s: float
    groups: tuple[AgentGroup, ...] = field(default=())


def load_trace(path: Path) -> Trace:
    """The last scheduler start recorded in ``path``; raises :class:`TraceError` or ``OSError``."""
    lines = path.read_bytes().splitlines()
    start = None
    for number, raw in enumerate(lines):
        if raw.startswith(b'{"trace"'):
            start = number
    if start is None:
        raise TraceError(f'{path}: no trace header (a line with "trace": "luftpause-scheduler")')
    arrivals: dict[str, list[tuple[float, str]]] = {}  # run -> (t, turn) in arrival order
    info: dict[str, tuple[ServiceClass, str]] = {}
    turn_run: dict[str, str] = {}
    finished: dict[str, tuple[float, int, int, bool]] = {}
    ended: dict[str, float] = {}
    last = 0.0
    for number in range(start + 1, len(lines)):
        raw = lines[number]
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
            t = float(line["t"])
            kind = line["e"]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{path}:{number + 1}: not a trace line ({exc})") from None
        last = max(last, t)
        if kind == "arrived":
            run = line["run"]
            arrivals.setdefault(run, []).append((t, line["turn"]))
            info.setdefault(run, ("batch" if line["class"] == "batch" else "interactive", line["caller"]))
            turn_run[line["turn"]] = run
        elif kind == "finished" and line["turn"] in turn_run:
            finished[line["turn"]] = (t, int(line["prompt"]), int(line["completion"]), bool(line["tools"]))
        elif kind == "run_ended":
            ended[line["run"]] = t
    runs = []
    for run_id, seen in arrivals.items():
        turns = []
        for index, (_, turn_id) in enumerate(seen):
            done = finished.get(turn_id)
            if done is None:
                break  # failed, abandoned or cut by the trace's end: the run stops here
            end, prompt, completion, tools = done
            following = seen[index + 1][0] if index + 1 < len(seen) else None
            turns.append(
                TracedTurn(
                    max(prompt, 1),
                    max(completion, 1),
                    tools,
                    None if following is None else max(0.0, following - end),
                )
            )
        if not turns:
            continue
        last_end = finished[seen[len(turns) - 1][1]][0]
        end_at = ended.get(run_id)
        service_class, caller = info[run_id]
        runs.append(
            TracedRun(
                run_id,
                service_class,
                caller,
                seen[0][0],
                tuple(turns),
                None if end_at is None or len(turns) < len(seen) else max(0.0, end_at - last_end),
            )
        )
    runs.sort(key=lambda run: run.started_at)
    return Trace(tuple(runs), max(last, 1e-3), _groups(runs))


def _groups(runs: list[TracedRun]) -> tuple[AgentGroup, ...]:
    """One group per (class, caller), as many agents as it had runs at once (start to last turn)."""
    spans: dict[tuple[ServiceClass, str], list[tuple[float, int]]] = {}
    for run in runs:
        length = sum(t.pause_after or 0.0 for t in run.turns)
        spans.setdefault((run.service_class, run.caller), []).extend(
            [(run.started_at, 1), (run.started_at + length + 1e-9, -1)]
        )
    groups = []
    for (service_class, caller), edges in spans.items():
        peak = level = 0
        for _, step in sorted(edges):
            level += step
            peak = max(peak, level)
        groups.append(AgentGroup(max(peak, 1), service_class, caller))
    return tuple(groups)


def replay_shape(trace: Trace) -> Trace:
    """``trace`` as the load of :func:`luftpause.testkit.sim.flood.simulate` (it is one already)."""
    return trace


def _key(*parts: str) -> bytes:
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=16).digest()


class Replay:
    """The runs of ``trace`` on ``clock``, sending to ``sink``; :attr:`runs` records each run."""

    def __init__(self, trace: Trace, clock: VirtualClock, sink: Sink) -> None:
        self.trace = trace
        self.shape = trace
        self.clock = clock
        self.sink = sink
        self.runs: list[Run] = []
        self._traced: dict[str, TracedRun] = {}
        self._next_turn = 0
        self._group = {(g.service_class, g.caller): i for i, g in enumerate(trace.groups)}
        self._started = [0] * len(trace.groups)

    def start(self) -> None:
        for traced in self.trace.runs:
            self.clock.call_at(traced.started_at, self._starter(traced))

    def _starter(self, traced: TracedRun) -> Callable[[], None]:
        return lambda: self._start(traced)

    def _start(self, traced: TracedRun) -> None:
        group = self._group[(traced.service_class, traced.caller)]
        agents = self.trace.groups[group].agents
        run = Run(
            traced.run_id,
            group,
            self._started[group] % agents,
            self._started[group],
            traced.service_class,
            traced.caller,
            self.clock.now,
        )
        self._started[group] += 1
        self.runs.append(run)
        self._traced[run.run_id] = traced
        first = traced.turns[0]
        self._send(run, 0, PrefixPath(((_key(run.run_id, "prompt"), first.prompt_tokens),)))

    def _send(self, run: Run, index: int, prompt: PrefixPath) -> None:
        traced = self._traced[run.run_id].turns[index]
        reply = (_key(run.run_id, "reply", str(index)), traced.completion_tokens)
        turn = Turn(
            f"r{self._next_turn}",
            run,
            index,
            prompt,
            traced.completion_tokens,
            reply,
            traced.tools,
            max_tokens=traced.completion_tokens,
            sent_at=self.clock.now,
            tool_call_seen=traced.tools,  # what the scheduler saw is what it recorded
        )
        self._next_turn += 1
        self.sink.send(turn, self.clock.now)

    def finished(self, turn: Turn, prompt_tokens: int, cached_tokens: int) -> None:
        run = turn.run
        run.turns += 1
        run.prompt_tokens += prompt_tokens
        run.cached_tokens += cached_tokens
        if turn.first_token_at is not None:
            run.ttfts.append(turn.first_token_at - turn.sent_at)
        traced = self._traced[run.run_id]
        step = traced.turns[turn.index]
        if turn.index + 1 < len(traced.turns):
            after = traced.turns[turn.index + 1]
            grown = max(0, after.prompt_tokens - turn.prompt.tokens - turn.reply[1])
            prompt = PrefixPath(
                (*turn.prompt.nodes, turn.reply, (_key(run.run_id, "tool", str(turn.index)), grown))
            )
            self.clock.call_later(step.pause_after or 0.0, lambda: self._send(run, turn.index + 1, prompt))
            return
        if traced.ended_after is None:
            run.state, run.ended_at = "cut_off", self.clock.now
            return
        run.state, run.ended_at = "completed", self.clock.now
        self.clock.call_later(traced.ended_after, lambda: self.sink.end_run(run, self.clock.now))

    def failed(self, turn: Turn, error: str) -> None:
        run = turn.run
        run.state, run.ended_at, run.error = "failed", self.clock.now, error
        self.sink.end_run(run, self.clock.now)
