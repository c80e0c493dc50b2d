"""The sub-agent loop: LLM turns through the dataplane, tool rounds on the upstream MCP servers.

One run, from its first turn to its answer::

    messages = [system?] + [user: task]
    repeat:
        check the subtree budgets (cancelled when one ran out)
        turn: POST {dataplane}/v1/chat/completions  (tools offered while the tool budget lasts)
        check the budgets
        no tool_calls in the reply  -> if the whole text is a call of an offered tool written as
                                       text (text_tool_calls.py), it is that call; else the text
                                       is the answer and the run is completed
        tool_calls                  -> one tool round: the reply journaled (``turn``) before any
                                       call runs; execute each call (each completion journaled,
                                       ``call``); append the assistant message and one ``role:
                                       tool`` message per call (journaled as one ``round``
                                       record, then the budgets are checked)
    finally: DELETE {dataplane}/v1/runs/{handle}   (best effort)

A tool call, in a round: the tool must be offered this turn and within the tool budget (each call
the model makes takes one unit, refused or not); its arguments go through
:func:`~luftpause.runtime.agent.tool_arguments.prepare_arguments` against the tool's ``inputSchema``; a
refusal is the call's result (``Error: invalid arguments for <tool>: <what and the shape expected>``)
and counts as a failed tool call, so the model can try again; then the approval gate; then the call
on its upstream server. A call that fails (error result, server gone) is never sent again by the
loop.

Parallel tool calls: with ``spawn(parallelToolCalls=true)`` the engine is told
``parallel_tool_calls: true`` and the calls of one reply run concurrently; by default it is told
``false``, and a reply that has several calls anyway has them run one after another, in order (the
model asked for each of them, refusing some would only cost it a turn to ask again). Results are
always in call order.

Limits: ``max_tokens`` is the run's ``maxTokens`` (256 by default; 0 sends none, so the engine's
own default applies); once the run's tool budget (8 by default) is spent, no tools are offered
and the model must answer.

Collaborators, given when the loop is built (:func:`luftpause.runtime.wiring.build_runtime`): the
run registry (every change to a run goes through it), the dataplane client, the upstream tools,
and, through the protocols below, the approval gate (:mod:`luftpause.runtime.agent.approvals`),
what arrived for a run since its last turn (:class:`Arrivals`: the inbox and notifications of
:mod:`luftpause.runtime.pods`), the runtime's built-in tools (:class:`BuiltinTools`: workspace and
orchestration, :mod:`luftpause.runtime.spawn.builtin_tools`) and the scope check of an upstream
call's path arguments (:class:`PathCheck`).

Pods: before every turn the run's inbox (messages sent while it ran) and its pending
notifications go into its conversation; a run that was asked to stop ends before a new turn (as
``cancelled``, ``stopped by ...``); a reply without tool calls while messages wait in the inbox is
not the end: the run takes them and goes on. Built-in tools are offered beside the upstream ones
(a built-in wins a name clash) and run in the runtime without the approval gate (the run's scope
gates them); an upstream tool's declared path arguments are checked against the run's scope first.

A run resumed after a restart starts the same loop on its rebuilt conversation, so the turn that
was in flight at the crash is simply asked again. A run resumed inside a tool round (its reply
journaled, the round not) is not asked again: it runs the calls of that round whose completion was
not journaled, each with the id it had (:func:`~luftpause.runtime.agent.upstream.call_id`, in the
MCP request's ``_meta``), takes the others' journaled results, and goes on. At least once: a call
in flight at the crash runs again.

A run the runtime's shutdown interrupts skips that last step: with a journal it resumes on the
next start and keeps its place at the scheduler (affinity, headroom) meanwhile; without one the
server ends all such runs at once afterwards
(:meth:`~luftpause.runtime.dataplane.DataplaneClient.end_runs`, bounded by
:data:`~luftpause.runtime.dataplane.SHUTDOWN_END_RUNS_SECONDS` in total), so a dead dataplane
cannot hold the shutdown up.

Request and reply shapes are the OpenAI chat completions API (non-streamed). Every turn carries
``x-luftpause-run-id``, ``x-luftpause-class`` and ``x-luftpause-caller`` so the dataplane can schedule
it as part of this run (docs/architecture.md "The proxy"); with ``LUFTPAUSE_TOKEN`` set, every request to
the dataplane (turns and run endings) also carries ``Authorization: Bearer <token>`` (docs/architecture.md
"Auth").
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from mcp.types import Tool

from luftpause.runtime.agent import spans as run_spans
from luftpause.runtime.agent.text_tool_calls import openai_tool_call, recover_tool_call
from luftpause.runtime.agent.tool_arguments import ToolArgumentsError, prepare_arguments
from luftpause.runtime.agent.upstream import UpstreamPool, call_id, openai_tool
from luftpause.runtime.dataplane import DataplaneClient
from luftpause.runtime.errors import LeaseLost, TurnFailed
from luftpause.runtime.runs.record import PendingRound
from luftpause.runtime.runs.registry import Run, RunRegistry

if TYPE_CHECKING:
    import concurrent.futures

log = logging.getLogger("luftpause.runtime.loop")

MAX_TOOLLESS_TOOL_TURNS = 2
"""Turns in a row in which the model calls tools although none were offered (its budget is
spent) before the run fails instead of looping for ever."""


def _first_message(reply: dict[str, Any]) -> dict[str, Any]:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise TurnFailed("dataplane reply has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise TurnFailed("dataplane reply has no message")
    return message


def _count_usage(run: Run, reply: dict[str, Any]) -> None:
    usage = reply.get("usage")
    if isinstance(usage, dict):
        run.costs.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        run.costs.completion_tokens += int(usage.get("completion_tokens") or 0)


class _Stopped(Exception):
    """The run was cancelled by its own budget check; its outcome is already recorded."""


ApprovalGate = Callable[[Run, str, dict[str, Any], int], Awaitable[str | None]]
"""Awaited before every upstream tool call (``run, tool, arguments, index of the call in its
reply``): ``None`` lets the call go, a text refuses it (the text is the call's failed result).
The runtime's gate waits for a person (:meth:`luftpause.runtime.agent.approvals.Approvals.gate`)."""


async def no_approval_needed(run: Run, tool: str, arguments: dict[str, Any], index: int) -> str | None:
    """The gate of a loop that asks nobody: every call goes."""
    return None


class Arrivals(Protocol):
    """What arrived for a run since its last turn (pods' inbox and notifications)."""

    def before_turn(self, run: Run) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages to add to ``run``'s conversation before its next turn and what their round
        record carries besides (the ids delivered); ``([], {})`` when nothing arrived. Taking them
        consumes them; the loop journals them as one round."""


class BuiltinTools(Protocol):
    """The runtime's own tools a run is offered beside the upstream ones."""

    def offered(self, run: Run) -> list[Tool]:
        """The built-ins ``run`` is offered now (they may depend on its scope and options)."""

    async def call(self, run: Run, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one: ``(text for the model, failed)``; never raises but for cancellation."""


class PathCheck(Protocol):
    """The scope check of an upstream call's declared path arguments."""

    def upstream_refusal(self, run: Run, name: str, arguments: dict[str, Any]) -> str | None:
        """``None`` when the call may go (its path arguments replaced by the real paths checked),
        else the refusal text."""


BUILTIN_SERVER = "builtin"
"""The ``server`` a call of one of the runtime's built-in tools is counted under."""

NO_SERVER = "none"
"""The ``server`` a call is counted under when it reached none: refused before it went out (not
offered, invalid arguments, the tool budget spent, out of the run's scope, approval refused) or
no server offers the tool."""

TURN_OUTCOMES = ("answered", "failed")


class LoopCounts:
    """What the loop counts since the process started (``GET /metrics``): LLM turns by outcome
    (``answered``; ``failed``: the dataplane refused or failed it), and tool calls the models made
    and those that failed, by the upstream MCP server they went to (:data:`BUILTIN_SERVER`,
    :data:`NO_SERVER` otherwise). Summed over servers, the tool counts are the runs' own
    ``toolCalls`` and ``failedToolCalls`` of those calls."""

    __slots__ = ("tool_calls", "tool_errors", "turns")

    def __init__(self, servers: list[str]) -> None:
        names = [*servers, BUILTIN_SERVER, NO_SERVER]
        self.turns = dict.fromkeys(TURN_OUTCOMES, 0)
        self.tool_calls = dict.fromkeys(names, 0)
        self.tool_errors = dict.fromkeys(names, 0)

    def tool_call(self, server: str, failed: bool) -> None:
        self.tool_calls[server] = self.tool_calls.get(server, 0) + 1
        if failed:
            self.tool_errors[server] = self.tool_errors.get(server, 0) + 1


class SubAgentLoop:
    """Drives runs, with what every run shares (module docstring: its collaborators); what it
    counts is :attr:`counts`."""

    def __init__(
        self,
        registry: RunRegistry,
        dataplane: DataplaneClient,
        upstream: UpstreamPool,
        *,
        approve: ApprovalGate = no_approval_needed,
        arrivals: Arrivals | None = None,
        builtins: BuiltinTools | None = None,
        path_check: PathCheck | None = None,
    ) -> None:
        self.registry = registry
        self.dataplane = dataplane
        self.upstream = upstream
        self.approve = approve
        self.arrivals = arrivals
        self.builtins = builtins
        self.path_check = path_check
        self.counts = LoopCounts([server.name for server in upstream.servers])

    async def drive(self, run: Run) -> None:
        """Run ``run`` to its end and record the outcome (``completed`` with its answer, or
        ``failed`` with the error text). Cancellation propagates (the registry records it)."""
        with run_spans.invoke_agent(run):
            try:
                answer = await self._turns(run)
            except _Stopped:
                pass
            except TurnFailed as exc:
                log.info("%s failed: %s", run.handle, exc)
                self.registry.finish(run, "failed", error=str(exc))
            else:
                self.registry.finish(run, "completed", answer=answer)
            finally:
                # A run the shutdown interrupted is ended by the server with all the others, in one
                # bounded step after every run has stopped (wiring.py, ``end_interrupted_runs``).
                if not run.interrupted:
                    # Shielded so a run cancelled mid-turn still tells the scheduler it is over.
                    await asyncio.shield(self.dataplane.end_run(run.handle))

    def _check(self, run: Run, ahead: dict[str, float] | None = None) -> None:
        self.registry.check_budgets(run, ahead)
        if run.done:
            raise _Stopped

    def _counted(self) -> None:
        # The monitor caches the network's JSON per registry version and shows each run's turns
        # and tool calls: a count that changed without a new version (a turn that starts a long
        # tool round, a call still running) would be shown stale until the round is recorded.
        self.registry.notify_changed()

    async def _offered(self, run: Run, spent: int) -> list[Tool]:
        """The tools ``run`` is offered with ``spent`` tool calls made: upstream and built-in (a
        built-in wins a name clash), none once the budget is spent."""
        if run.spec.max_tool_calls - spent <= 0:
            return []
        tools = await self.upstream.offered_tools(run.spec.allowed_tools)
        builtin = self.builtins.offered(run) if self.builtins is not None else []
        if builtin:
            names = {tool.name for tool in builtin}
            tools = [tool for tool in tools if tool.name not in names] + builtin
        return tools

    async def _turns(self, run: Run) -> str:
        toolless_tool_turns = 0
        while True:
            pending = run.pending_round
            if pending is None:
                asked = await self._turn(run, toolless_tool_turns)
                if isinstance(asked, str):
                    return asked
                pending, tools, toolless_tool_turns = asked
            else:  # resumed inside a tool round: its reply is journaled, not asked for again
                tools = await self._offered(run, pending.spent)
            began = time.monotonic()
            try:
                round_messages = await self._tool_round(run, pending, {tool.name: tool for tool in tools})
            finally:
                run.costs.tool_seconds += time.monotonic() - began
            if run.done:  # a budget of its subtree stopped a call of this round
                raise _Stopped
            # Recorded only once the whole round is done: a round is the unit the journal replays;
            # durable before the next turn, so a restart never repeats a completed round.
            self.registry.complete_round(run, round_messages)
            await self._durable(run, run.durability.last_written)

    async def _durable(self, run: Run, written: concurrent.futures.Future[None] | None) -> None:
        """Wait until the journal write ``written`` (a future, or ``None``) of ``run`` is done; a
        failed one was logged and its run marked not durable (registry.py): the run goes on. One
        refused by fencing (:class:`LeaseLost`) stops the run here, before any tool call: another
        runtime drives it now; it is neither ended here nor at the dataplane."""
        if written is not None:
            try:
                await asyncio.wrap_future(written)
            except LeaseLost:
                run.interrupted = True
                raise _Stopped from None
            except OSError:
                pass

    async def _turn(self, run: Run, toolless_tool_turns: int) -> str | tuple[PendingRound, list[Tool], int]:
        """One LLM turn: the answer (the run is done), or the tool round its reply begins, with the
        tools offered and the count of turns in a row that called tools none were offered for.
        The round's ``turn`` record is durable before this returns (its calls may run)."""
        spec = run.spec
        while True:
            self._check(run, {"tokens": 1})  # a subtree whose tokens are used up sends no more turns
            if run.stopped_by is not None:
                self.registry.finish(run, "cancelled", error=f"stopped by {run.stopped_by}")
                raise _Stopped
            if self.arrivals is not None:
                arrived, extra = self.arrivals.before_turn(run)
                if arrived:
                    self.registry.complete_round(run, arrived, **extra)
            tools = await self._offered(run, run.costs.tool_calls)
            body: dict[str, Any] = {"model": spec.model, "messages": run.messages}
            if tools:
                body["tools"] = [openai_tool(tool) for tool in tools]
                # OpenAI and vLLM refuse parallel_tool_calls without tools, so only send it with them.
                body["parallel_tool_calls"] = spec.parallel_tool_calls
            if spec.max_tokens > 0:
                body["max_tokens"] = spec.max_tokens
            began = time.monotonic()
            try:
                with run_spans.turn(run) as span:
                    reply = await self.dataplane.complete(
                        run.handle,
                        spec.service_class,
                        run.caller,
                        body,
                        run_spans.traceparent_headers(),  # the run's turn span, when tracing
                    )
                    run_spans.turn_reply(span, reply)
            except TurnFailed:
                self.counts.turns["failed"] += 1
                raise
            finally:
                run.costs.turn_seconds += time.monotonic() - began
            self.counts.turns["answered"] += 1
            run.costs.turns += 1
            _count_usage(run, reply)
            self._counted()
            self._check(run)
            message = _first_message(reply)
            offered = {tool.name: tool for tool in tools}
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list) or not calls:
                content = message.get("content")
                text = content if isinstance(content, str) else ""
                recovered = recover_tool_call(text, offered) if offered else None
                if recovered is None:
                    if run.inbox:  # messages came while it answered: it takes them and goes on
                        self.registry.complete_round(run, [{"role": "assistant", "content": text}])
                        continue
                    return text
                # The call replaces the text in the conversation: a model shown both would see
                # its call twice. The id is ours (the engine emitted none); any unique one works.
                calls = [openai_tool_call(recovered, f"call_{secrets.token_hex(12)}")]
                message = {"content": None}
            toolless_tool_turns = 0 if tools else toolless_tool_turns + 1
            if toolless_tool_turns > MAX_TOOLLESS_TOOL_TURNS:
                raise TurnFailed(
                    f"the model kept calling tools after its tool budget ({spec.max_tool_calls}) was spent"
                )
            assistant: dict[str, Any] = {
                "role": "assistant",
                "content": message.get("content"),
                "tool_calls": calls,
            }
            # No call runs before the reply is durable: a call that ran is then always one a restart
            # finds again, under the same id (never a call of a reply the engine is asked anew for).
            await self._durable(run, self.registry.begin_round(run, assistant))
            pending = run.pending_round
            if pending is None:  # ended meanwhile (cancelled while the record was written)
                raise _Stopped
            return pending, tools, toolless_tool_turns

    async def _tool_round(
        self, run: Run, pending: PendingRound, offered: dict[str, Tool]
    ) -> list[dict[str, Any]]:
        """Execute the pending round's tool calls, concurrently with ``parallel_tool_calls`` on,
        else in order; the round's messages (the assistant message, then one tool message per
        call, in call order). A call whose completion is journaled already (a round resumed after
        a restart) is not made again: its result is taken as it was.

        Each call takes one unit of the tool budget in call order, decided before any runs, so a
        concurrent round spends exactly what a sequential one would. The assistant message keeps
        the reply's ``tool_calls`` as they came and every tool message repeats its call's ``id``
        byte for byte: the dataplane and engines match them. Each completed call is journaled
        (:meth:`RunRegistry.complete_call`).
        """
        spent = pending.spent

        async def one(index: int, call: Any) -> dict[str, Any]:
            done = pending.done.get(index)
            if done is not None:
                return done[0]
            call_id = call.get("id", "") if isinstance(call, dict) else ""
            within_budget = spent + index < run.spec.max_tool_calls
            # Counted before it runs (in call order, before the first await, also when the
            # calls run concurrently), so a subtree's toolCalls budget is never passed: a call
            # that would pass it cancels the subtree instead of being made.
            if not run.done:
                self.registry.check_budgets(run, {"toolCalls": 1})
            if run.done:
                return {"role": "tool", "tool_call_id": call_id, "content": "Error: the run was stopped"}
            run.costs.tool_calls += 1
            self._counted()
            with run_spans.execute_tool(call) as span:
                text, failed, server = await self._execute(
                    run, call, offered, within_budget, index, pending.turn
                )
                run_spans.tool_outcome(span, failed, text)
            self.counts.tool_call(server, failed)
            if failed:
                run.costs.failed_tool_calls += 1
            result = {"role": "tool", "tool_call_id": call_id, "content": text}
            self.registry.complete_call(run, index, result, failed)
            return result

        calls = pending.calls
        if run.spec.parallel_tool_calls:
            results = list(await asyncio.gather(*(one(i, call) for i, call in enumerate(calls))))
        else:
            results = [await one(i, call) for i, call in enumerate(calls)]
        return [pending.message, *results]

    async def _execute(
        self,
        run: Run,
        call: Any,
        offered: dict[str, Tool],
        within_budget: bool,
        index: int = 0,
        turn: int = 0,
    ) -> tuple[str, bool, str]:
        """One tool call, the ``index``-th of the reply to turn ``turn``: ``(text for the model,
        failed, server)``, ``server`` being the one it went to (:data:`BUILTIN_SERVER`,
        :data:`NO_SERVER`, else an upstream server's name). Never raises but for cancellation."""
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            return "Error: the tool call names no function", True, NO_SERVER
        spent = f"Error: the tool budget ({run.spec.max_tool_calls} calls) is spent; answer now"
        tool = offered.get(name)
        if tool is None:
            refused = spent if not within_budget else f"Error: the tool {name!r} is not offered to you"
            return refused, True, NO_SERVER
        if not within_budget:
            return spent, True, NO_SERVER
        try:
            arguments = prepare_arguments(function.get("arguments"), tool.input_schema or {})
        except ToolArgumentsError as exc:
            return f"Error: invalid arguments for {name}: {exc}", True, NO_SERVER
        if self.builtins is not None and name in {t.name for t in self.builtins.offered(run)}:
            # The run's scope gates the built-in tools, not a person (pods/).
            text, failed = await self.builtins.call(run, name, arguments)
            return text, failed, BUILTIN_SERVER
        if self.path_check is not None:
            refusal = self.path_check.upstream_refusal(run, name, arguments)
            if refusal is not None:
                return refusal, True, NO_SERVER
        refusal = await self.approve(run, name, arguments, index)
        if refusal is not None:
            return refusal, True, NO_SERVER
        outcome = await self.upstream.call_tool(name, arguments, call_id(run.handle, turn, index))
        return outcome.text, outcome.failed, outcome.server or NO_SERVER
