"""The closed-loop agents of a flood, as :mod:`luftpause.testkit.load.agents` runs them over HTTP.

An agent starts a run, sends its first turn (system prompt + task), and for each reply that asks
for a tool waits for the tool (``tool_seconds``) and sends the run's next turn, whose prompt is the
last prompt, the reply and the tool's result; after ``tool_rounds`` rounds no tool is offered and
the reply is the answer (``reply_tokens`` long). The run is then ended (``DELETE /v1/runs/{id}``,
the scheduler's ``RunEnded``) and the agent starts its next run at once: the loop is closed.

Two harness behaviours beside that loop:

* **Cut-off sessions** (``cutoff_every``): every N-th run of an agent is cut off in the middle of a
  tool call, as a harness's turn limit or a failed turn cuts a session: the run sends no further
  turn and is never ended; the agent starts its next run at once.
* **Sub-agents over MCP** (``AgentGroup.via == "mcp"``): the runtime's sub-agent loop does the
  same turn/tool-round cycle, its turns carry the MCP caller as their caller, its tool rounds are
  MCP tool calls (``mcp_tool_seconds``, the fake MCP server's ``lookup``: 10-50 ms), and the
  runtime ends each finished run with ``DELETE /v1/runs/{id}``; the MCP client keeps ``agents``
  sub-agents running, spawning the next as one finishes (``await`` with ``mode = any``).

Prompts are :class:`~luftpause.testkit.engine.prefix_cache.PrefixPath` nodes, one per message, keyed
by a hash chained over the run id and the message's place, so no two runs share a prefix (each
agent's system prompt begins with its run id, as over HTTP) and a run's next turn shares all of its
last prompt and reply. Token counts are those of the HTTP agents: ``context_tokens`` for the
system prompt (about 4 characters a token), a short task, a tool call of ``tool_call_tokens``, a
tool result of ``tool_result_tokens``.

Randomness (agent start times within ``start_spread_s``, tool time jitter) comes from one
``random.Random(seed)``, so a flood is the same for the same seed.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from luftpause.testkit.engine.prefix_cache import PrefixPath
from luftpause.testkit.sim.clock import VirtualClock

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
"""The HTTP agents' pause after failed runs (:mod:`luftpause.testkit.load.agents`)."""

ServiceClass = Literal["interactive", "batch"]
Via = Literal["own_loop", "mcp"]


Z_99 = 2.3263478740408408
"""The standard normal's 99th percentile: a lognormal's ``sigma`` is ``ln(p99 / median) / Z_99``."""


@dataclass(frozen=True, slots=True)
class ToolTime:
    """How long one tool call takes, in seconds: ``constant`` (``seconds``), ``lognormal`` (its
    ``median`` and 99th percentile ``p99``, ``p99 >= median > 0``) or ``choice`` (one of
    ``values`` with ``weights``). Raises ``ValueError`` for anything else."""

    dist: Literal["constant", "lognormal", "choice"]
    seconds: float = 0.0
    median: float = 0.0
    p99: float = 0.0
    values: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.dist == "constant" and not self.seconds >= 0:
            raise ValueError(f"a constant tool time must be >= 0 s, got {self.seconds}")
        if self.dist == "lognormal" and not (self.median > 0 and self.p99 >= self.median):
            raise ValueError(f"a lognormal tool time needs p99 >= median > 0, got {self.median}, {self.p99}")
        if self.dist == "choice" and not (
            self.values
            and len(self.values) == len(self.weights)
            and min(self.values) >= 0
            and min(self.weights) >= 0
            and sum(self.weights) > 0
        ):
            raise ValueError("a choice of tool times needs values >= 0 and as many weights >= 0, not all 0")
        if self.dist not in ("constant", "lognormal", "choice"):
            raise ValueError(f"dist must be constant, lognormal or choice, got {self.dist!r}")

    def _sigma(self) -> float:
        """The lognormal's sigma (of the log of seconds) that puts its p99 at ``p99``."""
        return math.log(self.p99 / self.median) / Z_99

    def draw(self, rng: random.Random) -> float:
        """One tool call's seconds (a constant draws nothing from ``rng``)."""
        if self.dist == "constant":
            return self.seconds
        if self.dist == "lognormal":
            return rng.lognormvariate(math.log(self.median), self._sigma())
        return rng.choices(self.values, self.weights)[0]

    def mean(self) -> float:
        """The distribution's mean, in seconds."""
        if self.dist == "constant":
            return self.seconds
        if self.dist == "lognormal":
            sigma = self._sigma()
            return self.median * math.exp(sigma * sigma / 2)
        return sum(v * w for v, w in zip(self.values, self.weights, strict=True)) / sum(self.weights)


@dataclass(frozen=True, slots=True)
class AgentGroup:
    """``agents`` concurrent closed-loop agents of one service class and caller.

    ``via``: ``"own_loop"`` (an agent keeping its own loop, through the dataplane) or ``"mcp"``
    (sub-agents the runtime drives for an MCP client; ``caller`` is that client's MCP caller).
    ``tool_rounds`` and ``tool_seconds``: this group's, instead of the shape's (``None``: the
    shape's; a group's ``tool_seconds`` holds over MCP too, as the MCP tool's time).
    """

    agents: int
    service_class: ServiceClass = "interactive"
    caller: str = ""
    via: Via = "own_loop"
    tool_rounds: int | None = None
    tool_seconds: ToolTime | None = None


@dataclass(frozen=True, slots=True)
class LoadShape:
    """What a flood sends; times in seconds, sizes in tokens.

    The defaults are the published table's shape (issue 12): ~8,000-character contexts, up to 3
    tool calls per run, 256 reply tokens, closed loop, a 3-minute window.
    """

    groups: tuple[AgentGroup, ...]
    duration_s: float = 180.0
    context_tokens: int = 2000
    """The system prompt, one node (the HTTP agents' 8,000 characters at the simulator's 4 a token;
    :func:`published_shape` counts them as Llama 3 does)."""
    task_tokens: int = 16
    tool_rounds: int = 3
    tool_seconds: float = 0.5
    mcp_tool_seconds: tuple[float, float] = (0.010, 0.050)
    tool_jitter: float = 0.0
    """Each tool call takes ``tool_seconds`` times a factor drawn from ``1 +- tool_jitter``."""
    reply_tokens: int = 256
    tool_call_tokens: int = 22
    tool_result_tokens: int = 18
    cutoff_every: int = 0
    """Every N-th run of each agent is cut off in its first tool call (0: none)."""
    tool_calls_seen: bool = True
    """Whether the proxy sees the tool calls: ``False`` for agents that make their tool rounds
    themselves on replies with no tool call in them (``--tool-rounds-by agent``: a model that never
    calls tools, a harness whose tools are in text) and for chats whose next message is a
    person's: the run then looks ``idle`` to luftpause between its turns, never ``tool_paused``.
    The prompts and replies are the same either way."""
    start_spread_s: float = 1.0

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        if self.tool_rounds < 0 or self.context_tokens < 1 or self.reply_tokens < 1:
            raise ValueError("tool_rounds must be >= 0, context_tokens and reply_tokens >= 1")
        if not 0.0 <= self.tool_jitter < 1.0:
            raise ValueError(f"tool_jitter must be in [0, 1), got {self.tool_jitter}")


LLAMA3_SYSTEM_TOKENS = 2650
"""The HTTP agents' 8,000-character system prompt in Llama 3 tokens, with the chat template's
system header: the prompt repeats ``run loadgen-<32 hex digits>: you are a careful research
assistant working on one task. `` (105 characters), and Llama 3's BPE splits the hex run id into
many pieces, so 8,000 characters are 2,539 to 2,693 tokens (three run ids, counted with Meta's
Llama 3 vocabulary as the ``quicktok`` 0.4.0 package ships it), not 2,000; Llama 3.2's template adds
30 tokens of system header (``Environment: ipython``, knowledge and today dates)."""
LLAMA3_TASK_TOKENS = 161
"""The first user message with the offered tool, as Llama 3.2's template renders tools (its
"Given the following functions ..." preamble and the ``lookup`` schema at indent 4, then the
task): 161 tokens by the same count."""
LLAMA3_TOOL_CALL_TOKENS = 22
"""A ``lookup`` call as Llama 3.2 writes one (``{"name": ..., "parameters": {...}}`` and its
end-of-turn token)."""
LLAMA3_TOOL_RESULT_TOKENS = 18
"""The agent's tool result (``reference entry for ...``) as an ``ipython`` message."""


def published_shape(
    interactive: int = 4,
    batch: int = 48,
    duration_s: float = 180.0,
    via: Via = "own_loop",
    **changes: float,
) -> LoadShape:
    """The published table's flood (issue 12: 48 batch + 4 interactive agents, ~8,000-character
    contexts, 3 tool calls per run, 256 reply tokens, closed loop, 3 minutes), its prompts counted
    as Llama 3.2 counts them (:data:`LLAMA3_SYSTEM_TOKENS` and the rest): what a real SGLang
    replica's KV pool holds. ``via="mcp"``: sub-agents over MCP, callers ``claude-code`` and
    ``batch-orchestrator``; else own-loop agents, callers ``ide`` and ``bulk``. ``changes``: any
    other :class:`LoadShape` field."""
    callers = ("claude-code", "batch-orchestrator") if via == "mcp" else ("ide", "bulk")
    groups = [AgentGroup(interactive, "interactive", callers[0], via)]
    if batch:
        groups.append(AgentGroup(batch, "batch", callers[1], via))
    fields: dict[str, object] = {
        "duration_s": duration_s,
        "context_tokens": LLAMA3_SYSTEM_TOKENS,
        "task_tokens": LLAMA3_TASK_TOKENS,
        "tool_call_tokens": LLAMA3_TOOL_CALL_TOKENS,
        "tool_result_tokens": LLAMA3_TOOL_RESULT_TOKENS,
        **changes,
    }
    return LoadShape(tuple(groups), **fields)  # type: ignore[arg-type]


SMOLLM2_SYSTEM_TOKENS = 236
"""The HTTP agents' system prompt at ``--context-tokens 150`` (600 characters) in SmolLM2-135M's
tokens, as the REAL ENGINE flood (bench/README.md) sends it: counted by llama-server's
``/tokenize`` on the built model."""
SMOLLM2_TASK_TOKENS = 26
"""The rest of the first prompt (SmolLM2's chat template and the task): the first turn's usage
said 262 prompt tokens."""
SMOLLM2_TOOL_RESULT_TOKENS = 33
"""What an agent-made tool round adds besides the 24-token reply (the template drops the call and
keeps the result): each next turn's usage said 57 more prompt tokens."""


def llamacpp_shape(
    interactive: int = 1,
    batch: int = 6,
    duration_s: float = 180.0,
    **changes: float | bool,
) -> LoadShape:
    """The REAL ENGINE flood's load on llama.cpp (bench/README.md: 6 batch + 1 interactive own-loop
    agents, ``--context-tokens 150``, 2 tool rounds of 0.5 s made by the agents themselves, 24-token
    replies), its prompts counted as SmolLM2-135M counts them (:data:`SMOLLM2_SYSTEM_TOKENS` and
    the rest). SmolLM2 calls no tool, so the proxy sees none (``tool_calls_seen=False``): to
    luftpause each run is ``idle`` between its turns. ``changes``: any other :class:`LoadShape`
    field."""
    groups = [AgentGroup(interactive, "interactive", "ide")]
    if batch:
        groups.append(AgentGroup(batch, "batch", "bulk"))
    fields: dict[str, object] = {
        "duration_s": duration_s,
        "context_tokens": SMOLLM2_SYSTEM_TOKENS,
        "task_tokens": SMOLLM2_TASK_TOKENS,
        "tool_rounds": 2,
        "tool_seconds": 0.5,
        "reply_tokens": 24,
        "tool_call_tokens": 24,
        "tool_result_tokens": SMOLLM2_TOOL_RESULT_TOKENS,
        "tool_calls_seen": False,
        **changes,
    }
    return LoadShape(tuple(groups), **fields)  # type: ignore[arg-type]


@dataclass(slots=True)
class Turn:
    """One turn of a run: what the arrangement sends to an engine.

    ``prompt``: the prompt's nodes; ``output_tokens``: the reply's length; ``reply``: the node the
    engine caches for the reply when it finishes; ``tool_call``: the reply asks for a tool (the
    run then pauses on a tool round).
    """

    turn_id: str
    run: Run
    index: int
    prompt: PrefixPath
    output_tokens: int
    reply: tuple[bytes, int]
    tool_call: bool
    max_tokens: int = 0
    """The request's ``max_tokens`` (every turn asks for ``reply_tokens``)."""
    sent_at: float = 0.0
    first_token_at: float | None = None
    tool_call_seen: bool = False
    """The reply carries a tool call the proxy sees (``tool_call`` and ``LoadShape.tool_calls_seen``)."""


@dataclass(slots=True)
class Run:
    """One run of one agent, as the load generator records it (:class:`RunOutcome`'s fields)."""

    run_id: str
    group: int
    agent: int
    nth: int
    """The agent's run number (0 for its first)."""
    service_class: ServiceClass
    caller: str
    started_at: float
    cut_off: bool = False
    state: str = "unfinished"
    """``completed``, ``failed``, ``cut_off`` or ``unfinished`` (the window ended first)."""
    ended_at: float | None = None
    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    error: str = ""
    replicas: list[str] = field(default_factory=list)
    """The replica of each turn (an arrangement that moves runs shows it here)."""


class Sink(Protocol):
    """Where an agent sends its turns and run ends: an arrangement (:mod:`.arrangements`)."""

    def send(self, turn: Turn, now: float) -> None:
        """Turn ``turn`` was sent (a chat completion request) at ``now``."""

    def end_run(self, run: Run, now: float) -> None:
        """The agent ended ``run`` (``DELETE /v1/runs/{id}``) at ``now``."""


def _key(*parts: str | bytes) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\x00")
    return digest.digest()


class Agents:
    """Every agent of ``shape`` on ``clock``, sending to ``sink``; :attr:`runs` records each run."""

    def __init__(self, shape: LoadShape, clock: VirtualClock, sink: Sink, seed: int = 0) -> None:
        self.shape = shape
        self.clock = clock
        self.sink = sink
        self.rng = random.Random(seed)
        self.runs: list[Run] = []
        self._next_turn = 0
        self._backoff: dict[tuple[int, int], float] = {}
        self.on_run_end: Callable[[Run], None] | None = None

    def start(self) -> None:
        """Schedule every agent's first run within ``start_spread_s`` of now."""
        for group_index, group in enumerate(self.shape.groups):
            for agent in range(group.agents):
                offset = self.rng.uniform(0.0, self.shape.start_spread_s)
                self.clock.call_later(offset, self._starter(group_index, agent, 0))

    def _starter(self, group_index: int, agent: int, nth: int) -> Callable[[], None]:
        return lambda: self._start_run(group_index, agent, nth)

    def _start_run(self, group_index: int, agent: int, nth: int) -> None:
        group = self.shape.groups[group_index]
        now = self.clock.now
        run = Run(
            f"{group.service_class}-{group_index}-{agent}-{nth}",
            group_index,
            agent,
            nth,
            group.service_class,
            group.caller,
            now,
            cut_off=self.shape.cutoff_every > 0 and (nth + 1) % self.shape.cutoff_every == 0,
        )
        self.runs.append(run)
        root = _key(run.run_id, "system")
        prompt = PrefixPath(((root, self.shape.context_tokens), (_key(root, "task"), self.shape.task_tokens)))
        self._send(run, 0, prompt)

    def rounds(self, group_index: int) -> int:
        """Tool rounds per run of group ``group_index``."""
        rounds = self.shape.groups[group_index].tool_rounds
        return self.shape.tool_rounds if rounds is None else rounds

    def _send(self, run: Run, index: int, prompt: PrefixPath) -> None:
        shape = self.shape
        tool_call = index < self.rounds(run.group)
        last = prompt.nodes[-1][0]
        reply = (_key(last, "reply"), shape.tool_call_tokens if tool_call else shape.reply_tokens)
        turn = Turn(
            f"t{self._next_turn}",
            run,
            index,
            prompt,
            reply[1],
            reply,
            tool_call,
            max_tokens=shape.reply_tokens,
            sent_at=self.clock.now,
            tool_call_seen=tool_call and shape.tool_calls_seen,
        )
        self._next_turn += 1
        self.sink.send(turn, self.clock.now)

    def finished(self, turn: Turn, prompt_tokens: int, cached_tokens: int) -> None:
        """The turn's reply ended (its last token streamed): the agent goes on with the run."""
        run = turn.run
        now = self.clock.now
        run.turns += 1
        run.prompt_tokens += prompt_tokens
        run.cached_tokens += cached_tokens
        if turn.first_token_at is not None:
            run.ttfts.append(turn.first_token_at - turn.sent_at)
        if not turn.tool_call:
            run.state, run.ended_at = "completed", now
            self.sink.end_run(run, now)
            self._next_run(run)
            return
        if run.cut_off:
            # the session is cut off in the middle of its tool call: no next turn, no DELETE
            run.state, run.ended_at = "cut_off", now
            self._next_run(run)
            return
        group = self.shape.groups[run.group]
        if group.tool_seconds is not None:
            pause = group.tool_seconds.draw(self.rng)
        elif group.via == "mcp":
            pause = self.rng.uniform(*self.shape.mcp_tool_seconds)
        else:
            jitter = self.shape.tool_jitter
            pause = self.shape.tool_seconds * (self.rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0)
        prompt = PrefixPath(
            (
                *turn.prompt.nodes,
                turn.reply,
                (_key(turn.reply[0], "tool"), self.shape.tool_result_tokens),
            )
        )
        self.clock.call_later(pause, lambda: self._send(run, turn.index + 1, prompt))

    def failed(self, turn: Turn, error: str) -> None:
        """The turn failed (an error status: a gateway's queue timeout or full queue): the run fails
        and the agent backs off before its next run, as the HTTP agents do (1 s, doubling up to
        10 s while runs keep failing)."""
        run = turn.run
        run.state, run.ended_at, run.error = "failed", self.clock.now, error
        self.sink.end_run(run, self.clock.now)
        key = (run.group, run.agent)
        backoff = self._backoff.get(key, 0.0)
        backoff = min(MAX_BACKOFF_S, backoff * 2) if backoff else FIRST_BACKOFF_S
        self._backoff[key] = backoff
        if self.on_run_end is not None:
            self.on_run_end(run)
        self.clock.call_later(backoff, self._starter(run.group, run.agent, run.nth + 1))

    def _next_run(self, run: Run) -> None:
        self._backoff.pop((run.group, run.agent), None)
        if self.on_run_end is not None:
            self.on_run_end(run)
        self._start_run(run.group, run.agent, run.nth + 1)
