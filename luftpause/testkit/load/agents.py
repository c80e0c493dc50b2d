"""Own-loop agents for ``luftpause loadgen --agents``: each keeps its own loop and talks to the proxy.

An agent is what a harness that keeps its own loop does with luftpause as its ``base_url``: it
starts a run, sends a streamed Chat Completions turn with one tool offered, runs the tool calls the
model asks for (the tool is simulated: it sleeps ``tool_seconds`` and answers a line of text),
sends the results back as the run's next turn, and so on until the model answers or
``tool_rounds`` rounds were made (then it offers no tool, so the model must answer). Every turn
carries ``x-luftpause-run-id``, ``x-luftpause-class`` and ``x-luftpause-caller``; every run the
agent is done with is ended with ``DELETE /v1/runs/{id}``: completed, failed, and cut short at the
deadline (the proxy would otherwise keep its tool-paused headroom reserved until the run expires).
The loop is closed: a completed run is replaced at once by a new one until the deadline. After a
failed run the agent backs off before the next (1 s, doubling up to 10 s while runs keep failing,
back to none after a completed run; at least the ``Retry-After`` of a 429), so a proxy that is down
or refusing is not hammered in a hot loop.

Each run's system prompt is ``context_tokens`` tokens of text (about 4 bytes a token) that begins
with the run id, so no two runs share a prompt prefix beyond the engine's template, as with real
agents working on different tasks.

Who decides a tool round (``AgentSettings.tool_rounds_by``):

* ``"model"`` (the default): a round happens when the reply asks for tools, as above.
* ``"agent"``: every reply counts as a tool call until ``tool_rounds`` were made, whatever the
  model said, for models that never call tools (SmolLM2-135M on llama.cpp answers every turn in
  text, with ``tool_choice: "required"`` too): the turns stay real inference, only the decision is
  the agent's. A reply that carries tool calls is used as it is; one that does not is recorded as
  the assistant message it was plus one ``lookup`` call of the agent's own (id ``call-<the run
  id's last 12 characters>-<round>``, the reply's first 80 characters as its query), answered by
  a ``tool`` message, so the conversation stays the well-formed OpenAI shape a real tool round has
  (llama.cpp's ``--jinja`` renders it with SmolLM2's template, which drops the call and keeps the
  result). The
  engine and the proxy saw a reply without a tool call, so to luftpause that run is ``idle``, not
  ``tool_paused``, between its turns (no affinity, no headroom held for it).

How the tool is offered (``AgentSettings.tool_choice`` and ``forced_calls``):

* ``tool_choice``: sent as the body's ``tool_choice`` (``"auto"``, ``"required"``, ``"none"``) on
  every turn that offers the tool; ``None`` (the default) sends none (the engine's ``auto``).
* ``forced_calls``: the forced-call recipe for a small model on llama.cpp's server, whose replica
  renders tools with a ChatML tools template in the Qwen2.5 style (``<tool_call>`` JSON
  ``</tool_call>``; :func:`luftpause.testkit.launch.llama_server.tools_template`): every turn that offers
  the tool also carries an assistant message that opens the call up to its query
  (:data:`CALL_PREFILL`), which llama.cpp continues rather than answering anew, ``stop`` at the
  call's end (:data:`CALL_STOP`) and ``temperature`` 0; the server parses what it generated as one
  ``lookup`` call (``finish_reason: "tool_calls"``). The prefill is sent with that turn only: the
  conversation the run keeps records the parsed call, as OpenAI's shape has it. A reply that comes
  back without a call despite the prefill ends the run as an answer (with ``tool_rounds_by="model"``) and is
  counted in :attr:`RunOutcome.unforced`.

A group may carry its own ``tool_rounds`` and tool time (``AgentGroup.tool_rounds``,
``tool_seconds``: anything with ``draw(rng)``, as :class:`luftpause.testkit.sim.workload.ToolTime`;
each agent draws from a ``random.Random`` seeded by ``AgentSettings.seed``, its group and its
number, so a pass draws the same tool times for the same seed), and its ``priority`` (the body's
``priority``, for an engine started with priority scheduling).

``AgentSettings.spread`` sends the agents to several base URLs instead of ``proxy`` (agent ``i``
to ``spread[i % n]``, counted over every group), for engines reached directly with no proxy in
front; their ``DELETE /v1/runs/{id}`` then fails and is ignored.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import orjson

BYTES_PER_TOKEN = 4
"""Rough size of a token of English text, for sizing the system prompt."""
FIRST_BACKOFF_S = 1.0
"""Pause after a failed run; doubled after each further failed run in a row."""
MAX_BACKOFF_S = 10.0
"""Longest pause after failed runs (a longer ``Retry-After`` is still honoured)."""
END_RUN_TIMEOUT_S = 5.0
"""How long ``DELETE /v1/runs/{id}`` may take; ending a run is a courtesy, expiry frees it anyway."""

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a fact up in the reference library.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up"}},
            "required": ["query"],
        },
    },
}


TOOL_ROUNDS_BY = ("model", "agent")
"""Who decides that a reply is a tool round (module docstring)."""
TOOL_CHOICES = ("auto", "required", "none")
"""The ``tool_choice`` values an agent may send (OpenAI's string forms)."""
CALL_PREFILL = '<tool_call>\n{"name": "lookup", "arguments": {"query": "'
"""The assistant message a forced turn ends with: a ``lookup`` call in the Qwen2.5 ChatML tools
format opened up to its query's first character, which the model continues with the query and the
closing braces (with only ``<tool_call>`` opened, SmolLM2-135M wrote prose or broken JSON on long
system prompts, and llama.cpp's parser refused the turn with 500)."""
CALL_STOP = "</tool_call>"
"""Where a forced turn stops: the call's end in the same format."""


class ToolDraw(Protocol):
    """How long one tool call takes: ``draw(rng)`` seconds (:class:`~luftpause.testkit.sim.workload.
    ToolTime` is one)."""

    def draw(self, rng: random.Random) -> float: ...


@dataclass(frozen=True, slots=True)
class AgentGroup:
    """``agents`` concurrent closed-loop agents of one service class and caller; ``headers`` are
    sent with every turn besides luftpause's (e.g. a gateway's own class header). ``program_id``:
    each turn's body also names its run as ``program_id`` and the run's end also posts ``POST
    /programs/release`` (ThunderAgent's program API). ``tool_rounds`` and ``tool_seconds``: this
    group's instead of :class:`AgentSettings`' (``None``: the settings'); ``priority``: sent as the
    body's ``priority`` (``None``: none sent)."""

    agents: int
    service_class: str = "interactive"
    caller: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    program_id: bool = False
    tool_rounds: int | None = None
    tool_seconds: ToolDraw | None = None
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """What every agent of a pass shares.

    ``proxy`` is the dataplane's base URL (``http://host:port``, no ``/v1``); times in seconds.
    ``tool_rounds_by`` is ``"model"`` or ``"agent"``, ``spread`` a tuple of base URLs,
    ``tool_choice`` one of :data:`TOOL_CHOICES` or ``None``, ``forced_calls`` the forced-call recipe
    and ``seed`` what the agents' tool times are drawn from (all in the module docstring). Raises
    ``ValueError`` for an unknown ``tool_rounds_by`` or ``tool_choice``.
    """

    proxy: str
    model: str
    task: str
    tool_rounds: int = 2
    context_tokens: int = 512
    tool_seconds: float = 0.2
    max_tokens: int = 64
    token: str | None = None
    tool_rounds_by: str = "model"
    spread: tuple[str, ...] = ()
    tool_choice: str | None = None
    forced_calls: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tool_rounds_by not in TOOL_ROUNDS_BY:
            raise ValueError(f"tool_rounds_by must be one of {TOOL_ROUNDS_BY}, not {self.tool_rounds_by!r}")
        if self.tool_choice is not None and self.tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {TOOL_CHOICES} or None, not {self.tool_choice!r}")


@dataclass(slots=True)
class RunOutcome:
    """One run of one agent: its turns' times to first token (s), wall time (s) and how it ended.

    ``state`` is ``completed`` (the model answered), ``failed`` (a turn failed; ``error`` says
    why, ``retry_after`` is the seconds of a 429's ``Retry-After``) or ``unfinished`` (the deadline
    came first). ``tool_rounds`` counts the replies that asked for tools, ``tool_calls`` the calls
    in them (a round may hold parallel calls). ``unforced`` counts the forced turns
    (``forced_calls``) that came back without a call.
    """

    group: int
    service_class: str
    caller: str
    run_id: str = ""
    state: str = "unfinished"
    seconds: float = 0.0
    turns: int = 0
    tool_rounds: int = 0
    tool_calls: int = 0
    unforced: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    error: str = ""
    retry_after: float | None = None


class TurnFailed(Exception):
    """A turn that did not complete: an HTTP error status or a stream cut before its end.
    ``retry_after`` is the answer's ``Retry-After`` in seconds (RFC 9110 section 10.2.3, the
    delay form), when it had one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds; None when absent or an HTTP date (not used by engines)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 3600 else None


@dataclass(slots=True)
class _Reply:
    ttft: float | None
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    prompt_tokens: int = 0
    cached_tokens: int = 0


def system_prompt(run_id: str, context_tokens: int) -> str:
    """A run's system prompt: ``context_tokens`` tokens of text (about 4 bytes a token) that
    begins with ``run_id`` (module docstring)."""
    words = f"run {run_id}: you are a careful research assistant working on one task. "
    size = max(context_tokens * BYTES_PER_TOKEN, len(words))
    return (words * (size // len(words) + 1))[:size]


def merge_tool_call_delta(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    """Fold one streamed tool-call delta into ``calls`` (OpenAI's streaming shape, by ``index``):
    ``calls`` grows to the delta's ``index`` with empty ``function`` calls, a non-empty ``id`` or
    ``function.name`` replaces the call's, ``function.arguments`` is appended (a continuation's
    empty id keeps the first one)."""
    index = delta.get("index", 0)
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] = function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


async def stream_turn(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict[str, Any]
) -> _Reply:
    """Send one streamed turn and read it to its end.

    Prompt and cached prompt tokens come from the final usage chunk (``stream_options:
    include_usage``; ``usage.prompt_tokens_details.cached_tokens`` as OpenAI and vLLM report a
    prefix-cache hit), 0 when the engine reports none. Time to first token is measured from the
    request to the first delta with content or a tool call. Raises :class:`TurnFailed` for a
    non-200 answer (with the error body's message) or a stream that ends with no
    ``finish_reason``.
    """
    started = time.perf_counter()
    ttft: float | None = None
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    finish: str | None = None
    usage: dict[str, Any] = {}
    async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
        if response.status != 200:
            text = await response.text()
            try:
                text = orjson.loads(text)["error"]["message"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                pass
            raise TurnFailed(
                f"HTTP {response.status}: {text}"[:300], _retry_after(response.headers.get("retry-after"))
            )
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]" or not data:
                continue
            chunk = orjson.loads(data)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    content.append(delta["content"])
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                for call in delta.get("tool_calls") or ():
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    merge_tool_call_delta(calls, call)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    if finish is None:
        raise TurnFailed("the stream ended without a finish_reason")
    details = usage.get("prompt_tokens_details") or {}
    return _Reply(
        ttft,
        "".join(content),
        calls,
        finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )


async def run_once(
    session: aiohttp.ClientSession,
    settings: AgentSettings,
    spec: AgentGroup,
    outcome: RunOutcome,
    rng: random.Random | None = None,
) -> None:
    """One run from its first turn to its answer, recorded in ``outcome`` as it goes (so that a
    run cancelled at the deadline keeps its turns' times, as ``unfinished``). ``rng``: what the
    group's ``tool_seconds`` are drawn from (default: one seeded by ``settings.seed``)."""
    rng = rng if rng is not None else random.Random(settings.seed)
    rounds = spec.tool_rounds if spec.tool_rounds is not None else settings.tool_rounds
    run_id = f"loadgen-{uuid.uuid4().hex}"
    outcome.run_id = run_id
    headers = {
        "content-type": "application/json",
        "x-luftpause-run-id": run_id,
        "x-luftpause-class": spec.service_class,
    }
    if spec.caller:
        headers["x-luftpause-caller"] = spec.caller
    headers.update(spec.headers)
    if settings.token:
        headers["authorization"] = f"Bearer {settings.token}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(run_id, settings.context_tokens)},
        {"role": "user", "content": settings.task},
    ]
    url = f"{settings.proxy}/v1/chat/completions"
    started = time.perf_counter()
    try:
        while True:
            body: dict[str, Any] = {
                "model": settings.model,
                "messages": messages,
                "stream": True,
                "max_tokens": settings.max_tokens,
                "stream_options": {"include_usage": True},
            }
            if spec.program_id:
                body["program_id"] = run_id
            if spec.priority is not None:
                body["priority"] = spec.priority
            offer_tool = outcome.tool_rounds < rounds
            if offer_tool:
                _offer_tool(body, settings)
            reply = await stream_turn(session, url, headers, body)
            outcome.turns += 1
            outcome.prompt_tokens += reply.prompt_tokens
            outcome.cached_tokens += reply.cached_tokens
            if reply.ttft is not None:
                outcome.ttfts.append(reply.ttft)
            if offer_tool and settings.forced_calls and not reply.tool_calls:
                outcome.unforced += 1
            if offer_tool and not reply.tool_calls and settings.tool_rounds_by == "agent":
                reply.tool_calls = [_agent_tool_call(run_id, outcome.tool_rounds, reply.content)]
            if not (offer_tool and reply.tool_calls):
                outcome.state = "completed"
                break
            messages.append(
                {"role": "assistant", "content": reply.content or None, "tool_calls": reply.tool_calls}
            )
            outcome.tool_rounds += 1
            await asyncio.sleep(
                spec.tool_seconds.draw(rng) if spec.tool_seconds is not None else settings.tool_seconds
            )
            for call in reply.tool_calls:
                outcome.tool_calls += 1
                result = f"reference entry for {call['function']['arguments'][:80]}"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    except (TurnFailed, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        outcome.state = "failed"
        outcome.error = str(exc) or type(exc).__name__
        outcome.retry_after = exc.retry_after if isinstance(exc, TurnFailed) else None
    finally:
        outcome.seconds = time.perf_counter() - started
    # A run cut at the deadline is cancelled above and never gets here: closed_loop ends it.
    await end_run(session, settings, run_id)
    if spec.program_id:
        await release_program(session, settings, run_id)


def _offer_tool(body: dict[str, Any], settings: AgentSettings) -> None:
    """Offer ``lookup`` in ``body``, with ``tool_choice`` and the forced-call recipe as ``settings``
    say (module docstring)."""
    body["tools"] = [LOOKUP_TOOL]
    if settings.tool_choice is not None:
        body["tool_choice"] = settings.tool_choice
    if settings.forced_calls:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": CALL_PREFILL}]
        body["stop"] = [CALL_STOP]
        body["temperature"] = 0


def _agent_tool_call(run_id: str, round_: int, content: str) -> dict[str, Any]:
    """The ``lookup`` call an agent makes of a reply that had none (``tool_rounds_by="agent"``)."""
    query = " ".join(content.split())[:80] or "the task"
    return {
        "id": f"call-{run_id[-12:]}-{round_}",
        "type": "function",
        "function": {
            "name": LOOKUP_TOOL["function"]["name"],
            "arguments": orjson.dumps({"query": query}).decode(),
        },
    }


async def end_run(session: aiohttp.ClientSession, settings: AgentSettings, run_id: str) -> None:
    """``DELETE /v1/runs/{run_id}`` on the proxy, within :data:`END_RUN_TIMEOUT_S`; errors are
    ignored (ending a run only frees scheduler state sooner; expiry frees it anyway)."""
    headers = {"authorization": f"Bearer {settings.token}"} if settings.token else {}
    url = f"{settings.proxy}/v1/runs/{run_id}"
    try:
        async with session.delete(url, headers=headers, timeout=aiohttp.ClientTimeout(END_RUN_TIMEOUT_S)):
            pass
    except (aiohttp.ClientError, TimeoutError):
        pass


async def release_program(session: aiohttp.ClientSession, settings: AgentSettings, run_id: str) -> None:
    """``POST /programs/release`` with ``{"program_id": run_id}`` (ThunderAgent), within
    :data:`END_RUN_TIMEOUT_S`; errors are ignored, as :func:`end_run`'s."""
    url = f"{settings.proxy}/programs/release"
    try:
        async with session.post(
            url,
            data=orjson.dumps({"program_id": run_id}),
            headers={"content-type": "application/json"},
            timeout=aiohttp.ClientTimeout(END_RUN_TIMEOUT_S),
        ):
            pass
    except (aiohttp.ClientError, TimeoutError):
        pass


async def closed_loop(
    settings: AgentSettings,
    groups: list[AgentGroup],
    duration_s: float,
    on_outcome: Callable[[RunOutcome], None] | None = None,
) -> list[RunOutcome]:
    """Run every group's agents, each replacing its finished run at once, for ``duration_s`` s.

    Returns every run that ended (completed or failed) within the duration, and the runs the
    deadline cut short as ``unfinished`` (each ended on the proxy all the same).
    ``on_outcome(outcome)`` is called as each run ends (progress display). After a failed run the
    agent pauses as the module docstring says.
    """
    outcomes: list[RunOutcome] = []
    deadline = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def agent(group: int, spec: AgentGroup, number: int) -> None:
            rng = random.Random(f"{settings.seed}-{group}-{number}")
            mine = settings
            if settings.spread:
                mine = replace(settings, proxy=settings.spread[number % len(settings.spread)])
            backoff = 0.0
            while time.monotonic() < deadline:
                outcome = RunOutcome(group=group, service_class=spec.service_class, caller=spec.caller)
                outcomes.append(outcome)
                try:
                    await asyncio.wait_for(
                        run_once(session, mine, spec, outcome, rng), deadline - time.monotonic()
                    )
                except TimeoutError:
                    # wait_for cancelled the run and waited for it: it stays "unfinished", and is
                    # over for this agent, so the proxy is told as for any other end.
                    if outcome.run_id:
                        await end_run(session, mine, outcome.run_id)
                    return
                if on_outcome is not None:
                    on_outcome(outcome)
                if outcome.state == "completed":
                    backoff = 0.0
                    continue
                backoff = min(MAX_BACKOFF_S, backoff * 2) if backoff else FIRST_BACKOFF_S
                pause = max(backoff, outcome.retry_after or 0.0)
                await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic())))

        specs = [(index, spec) for index, spec in enumerate(groups) for _ in range(spec.agents)]
        await asyncio.gather(*(agent(index, spec, number) for number, (index, spec) in enumerate(specs)))
    return outcomes
