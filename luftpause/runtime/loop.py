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
        tool_calls                  -> one tool round: execute each call, append the assistant
                                       message and one ``role: tool`` message per call (journaled
                                       as one record, then the budgets are checked)
    finally: DELETE {dataplane}/v1/runs/{handle}   (best effort)

A tool call, in a round: the tool must be offered this turn and within the tool budget (each call
the model makes takes one unit, refused or not); its arguments go through
:func:`~luftpause.runtime.tool_arguments.prepare_arguments` against the tool's ``inputSchema``; a
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

Pods (:mod:`luftpause.runtime.pods`, through :class:`PodHooks`): before every turn the run's
inbox (messages sent while it ran) and its pending notifications go into its conversation; a
run that was asked to stop ends before a new turn (as ``cancelled``, ``stopped by ...``); a reply
without tool calls while messages wait in the inbox is not the end: the run takes them and goes
on. Built-in tools (workspace, orchestration) are offered beside the upstream ones (a built-in
wins a name clash) and run in the runtime without the approval gate (the run's scope gates
them); an upstream tool's declared path arguments are checked against the run's scope first.

A run resumed after a restart starts the same loop on its rebuilt conversation, so the turn that
was in flight at the crash is simply asked again.

A run the runtime's shutdown interrupts skips that last step: with a journal it resumes on the
next start and keeps its place at the scheduler (affinity, headroom) meanwhile; without one the
server ends all such runs at once afterwards (:meth:`DataplaneClient.end_runs`, bounded by
:data:`SHUTDOWN_END_RUNS_SECONDS` in total), so a dead dataplane cannot hold the shutdown up.

Request and reply shapes are the OpenAI chat completions API (non-streamed). Every turn carries
``x-luftpause-run-id``, ``x-luftpause-class`` and ``x-luftpause-caller`` so the dataplane can schedule
it as part of this run (DESIGN.md, "The dataplane"); with ``LUFTPAUSE_TOKEN`` set, every request to
the dataplane (turns and run endings) also carries ``Authorization: Bearer <token>`` (DESIGN.md,
"Auth").
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import aiohttp
from mcp.types import Tool

from luftpause.runtime import run_spans
from luftpause.runtime.errors import TurnFailed
from luftpause.runtime.runs import Run, RunRegistry
from luftpause.runtime.text_tool_calls import openai_tool_call, recover_tool_call
from luftpause.runtime.tool_arguments import ToolArgumentsError, prepare_arguments
from luftpause.runtime.upstream import UpstreamPool, openai_tool

log = logging.getLogger("luftpause.runtime.loop")

TURN_TIMEOUT_SECONDS = 600.0
"""One turn, queue wait at the dataplane included (DESIGN.md constants: 10 min)."""

DEFAULT_RETRY_AFTER_SECONDS = 1.0
"""Wait after a 429 without a usable ``Retry-After`` header."""

MAX_TOOLLESS_TOOL_TURNS = 2
"""Turns in a row in which the model calls tools although none were offered (its budget is
spent) before the run fails instead of looping for ever."""

CALLER_HEADER_MAX_BYTES = 128

RUN_END_TIMEOUT_SECONDS = 5.0
"""Longest one ``DELETE /v1/runs/{handle}`` may take (seconds)."""

SHUTDOWN_END_RUNS_SECONDS = 2.0
"""Longest the runtime's shutdown spends ending the runs it interrupted, all together (seconds):
long enough for a live dataplane to answer thousands of them, short enough that a dead one does not
noticeably delay the shutdown (a supervisor's grace period is often 5-10 s)."""


def new_http_session(ssl_context: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """The one aiohttp session all runs share (``ssl_context``: for an ``https://`` dataplane
    signed by a private CA, or one that asks for a client certificate).

    A turn may take :data:`TURN_TIMEOUT_SECONDS` (600 s) in total, queue wait at the dataplane
    included, and nothing in aiohttp may cut it shorter: its default timeout (``total=300`` with
    ``sock_connect=30``) is replaced by one whose only bound is that total (connect, socket connect
    and socket read unset), and the connector has no connection cap (``limit=0``, and none per
    host), because a held turn keeps its connection open while the dataplane queues it, so a pool
    wait could otherwise eat into the turn.
    """
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(
            total=TURN_TIMEOUT_SECONDS, connect=None, sock_connect=None, sock_read=None
        ),
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ssl=ssl_context or True),
    )


_HEADER_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {"%"}


def header_safe(value: str, max_bytes: int = CALLER_HEADER_MAX_BYTES) -> str:
    """``value`` as an ``x-luftpause-caller`` header value: printable ASCII but ``%`` as it is,
    every other character (non-ASCII, space, ``%``, control characters such as CR and LF) as
    the percent-encoded bytes of its UTF-8 (RFC 3986 section 2.1), cut to at most ``max_bytes``
    bytes on a character boundary; ``anonymous`` when nothing is left.

    aiohttp sends header values as latin-1 and the dataplane refuses a value that is not UTF-8,
    so raw UTF-8 cannot cross; ASCII crosses both unchanged. Nobody decodes it: the dataplane and
    the scheduler take the caller as an opaque id of at most 128 bytes (README, headers table).
    An encoding is one-to-one, so two callers never share a fairness slot by it."""
    out: list[str] = []
    size = 0
    for ch in value:
        piece = (
            ch if ch in _HEADER_SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        )
        if size + len(piece) > max_bytes:
            break
        out.append(piece)
        size += len(piece)
    return "".join(out) or "anonymous"


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float:
    """How long to wait after a 429 whose ``Retry-After`` header is ``value`` (RFC 9110 section
    10.2.3: delay-seconds or an HTTP-date; fractional seconds are accepted too), in seconds.

    A date is counted from ``now`` (default: the current UTC time); a past date or a negative
    number means at once. No header, or one that is neither, means
    :data:`DEFAULT_RETRY_AFTER_SECONDS`. The wait is at most :data:`TURN_TIMEOUT_SECONDS`.
    """
    seconds = DEFAULT_RETRY_AFTER_SECONDS
    text = (value or "").strip()
    if text:
        try:
            number = float(text)
        except ValueError:
            try:
                when = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None:
                if when.tzinfo is None:  # RFC 9110 dates are GMT
                    when = when.replace(tzinfo=UTC)
                seconds = (when - (now or datetime.now(UTC))).total_seconds()
        else:
            if math.isfinite(number):
                seconds = number
    return min(max(seconds, 0.0), TURN_TIMEOUT_SECONDS)


def _error_message(status: int, body: bytes) -> str:
    try:
        data = json.loads(body)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data["error"]
        text = str(message)
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()[:500]
    return f"dataplane answered {status}: {text}" if text else f"dataplane answered {status}"


class DataplaneClient:
    """The runtime's side of the dataplane: one turn at a time per run, and run endings.

    ``token`` (the shared ``LUFTPAUSE_TOKEN``, or ``None``) is sent as ``Authorization: Bearer``
    on every request, so a dataplane that requires it admits the runtime's turns.
    """

    def __init__(self, base_url: str, session: aiohttp.ClientSession, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self._auth: dict[str, str] = {"Authorization": f"Bearer {token}"} if token else {}

    def _headers(self, run: Run) -> dict[str, str]:
        return {
            **self._auth,
            "x-luftpause-run-id": run.handle,
            "x-luftpause-class": run.service_class,
            "x-luftpause-caller": header_safe(run.caller),
            **run_spans.traceparent_headers(),  # the turn's chat span, when tracing
        }

    async def complete(self, run: Run, body: dict[str, Any]) -> dict[str, Any]:
        """POST one non-streamed chat completion for ``run``; the reply as JSON.

        A 429 is waited out (``Retry-After`` seconds, else 1 s) and retried until the run is
        cancelled. Raises :class:`TurnFailed` for any other HTTP error status, a connection error,
        the 600 s turn timeout or a reply that is not a JSON object.
        """
        url = f"{self.base_url}/v1/chat/completions"
        while True:
            try:
                async with self.session.post(url, json=body, headers=self._headers(run)) as response:
                    raw = await response.read()
                    if response.status == 429:
                        delay = retry_after_seconds(response.headers.get("Retry-After"))
                    elif response.status >= 400:
                        raise TurnFailed(_error_message(response.status, raw))
                    else:
                        reply = json.loads(raw)
                        if not isinstance(reply, dict):
                            raise TurnFailed("dataplane reply is not a JSON object")
                        return reply
            except aiohttp.ClientError as exc:
                raise TurnFailed(f"dataplane {url}: {exc or type(exc).__name__}") from exc
            except TimeoutError as exc:
                raise TurnFailed(f"dataplane {url}: no reply within {TURN_TIMEOUT_SECONDS:.0f} s") from exc
            except ValueError as exc:  # json.loads
                raise TurnFailed(f"dataplane reply is not JSON: {exc}") from exc
            await asyncio.sleep(delay)

    async def end_run(self, handle: str) -> bool:
        """``DELETE /v1/runs/{handle}``: the run ended, the scheduler may forget it.

        Best effort, at most :data:`RUN_END_TIMEOUT_SECONDS`: every error is logged and ignored.
        Returns whether the dataplane acknowledged it (a 2xx status).
        """
        url = f"{self.base_url}/v1/runs/{handle}"
        try:
            async with self.session.delete(
                url, headers=self._auth, timeout=aiohttp.ClientTimeout(total=RUN_END_TIMEOUT_SECONDS)
            ) as response:
                raw = await response.read()
                if response.status >= 400:  # a 401 here means the tokens of the two processes differ
                    refusal = _error_message(response.status, raw)
                    log.warning("the dataplane refused the end of %s: %s", handle, refusal)
                    return False
                return True
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("could not report the end of %s to the dataplane: %s", handle, exc)
            return False

    async def end_runs(self, handles: list[str], seconds: float = SHUTDOWN_END_RUNS_SECONDS) -> int:
        """:meth:`end_run` for every handle, all at once, for at most ``seconds`` in total; the
        requests still open then are cancelled. Returns how many the dataplane acknowledged.
        Never raises (but for the caller's own cancellation)."""
        if not handles:
            return 0
        requests = [asyncio.ensure_future(self.end_run(handle)) for handle in handles]
        try:
            done, pending = await asyncio.wait(requests, timeout=seconds)
        finally:
            for request in requests:  # those still open; also when we are cancelled ourselves
                request.cancel()
        if pending:
            await asyncio.wait(pending)  # let the cancelled requests close their connections
        ended = sum(1 for request in done if not request.cancelled() and request.result())
        if ended < len(handles):
            log.warning(
                "%d of %d runs stopped by the shutdown could not be ended at the dataplane "
                "(%d unanswered after %.1f s); the scheduler forgets them after its run idle expiry",
                len(handles) - ended,
                len(handles),
                len(pending),
                seconds,
            )
        return ended


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
        run.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        run.completion_tokens += int(usage.get("completion_tokens") or 0)


class _Stopped(Exception):
    """The run was cancelled by its own budget check; its outcome is already recorded."""


def _check(run: Run, ahead: dict[str, float] | None = None) -> None:
    run.check_budgets(ahead)
    if run.done:
        raise _Stopped


async def _no_approval_needed(run: Run, tool: str, arguments: dict[str, Any], index: int) -> str | None:
    return None


class PodHooks(Protocol):
    """What the loop asks the pods (:class:`luftpause.runtime.pods.Pods`) at each turn."""

    registry: RunRegistry
    """The runs' registry: the loop tells it when a run's counters change
    (:meth:`RunRegistry.notify_changed`), since the monitor's network shows them."""

    def before_turn(self, run: Run) -> None:
        """Move the run's inbox and pending notifications into its conversation (journaled)."""

    def builtin_tools(self, run: Run) -> list[Tool]:
        """The runtime's own tools this run is offered (workspace, orchestration)."""

    async def call_builtin(self, run: Run, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run a built-in tool: ``(text for the model, failed)``; never raises but cancellation."""

    def upstream_refusal(self, run: Run, name: str, arguments: dict[str, Any]) -> str | None:
        """``None`` when the upstream call's declared path arguments are in the run's scope, else
        the refusal text."""


ApprovalGate = Callable[[Run, str, dict[str, Any], int], Awaitable[str | None]]
"""Awaited before every tool call (``run, tool, arguments, index of the call in its reply``):
``None`` lets the call go, a text refuses it (the text is the call's failed result). The
runtime's gate waits for a person (:mod:`luftpause.runtime.approvals`)."""


class SubAgentLoop:
    """Drives runs: what every run shares (the dataplane client and the upstream tools)."""

    def __init__(self, dataplane: DataplaneClient, upstream: UpstreamPool) -> None:
        self.dataplane = dataplane
        self.upstream = upstream
        self.approval_gate: ApprovalGate = _no_approval_needed
        self.pods: PodHooks | None = None

    async def drive(self, run: Run) -> None:
        """Run ``run`` to its end and record the outcome on it (``completed`` with its answer,
        or ``failed`` with the error text). Cancellation propagates (the registry records it)."""
        with run_spans.invoke_agent(run):
            try:
                answer = await self._turns(run)
            except _Stopped:
                pass
            except TurnFailed as exc:
                log.info("%s failed: %s", run.handle, exc)
                run.finish("failed", error=str(exc))
            else:
                run.finish("completed", answer=answer)
            finally:
                # A run the shutdown interrupted is ended by the server with all the others, in one
                # bounded step after every run has stopped (server.py, ``end_interrupted_runs``).
                if not run.interrupted:
                    # Shielded so a run cancelled mid-turn still tells the scheduler it is over.
                    await asyncio.shield(self.dataplane.end_run(run.handle))

    def _counted(self) -> None:
        # The monitor caches the network's JSON per registry version and shows each run's turns
        # and tool calls: a count that changed without a new version (a turn that starts a long
        # tool round, a call still running) would be shown stale until the round is recorded.
        if self.pods is not None:
            self.pods.registry.notify_changed()

    async def _turns(self, run: Run) -> str:
        toolless_tool_turns = 0
        while True:
            _check(run, {"tokens": 1})  # a subtree whose tokens are used up sends no more turns
            if run.stopped_by is not None:
                run.finish("cancelled", error=f"stopped by {run.stopped_by}")
                raise _Stopped
            if self.pods is not None:
                self.pods.before_turn(run)
            budget_left = run.max_tool_calls - run.tool_calls
            tools = await self.upstream.offered_tools(run.allowed_tools) if budget_left > 0 else []
            builtin = self.pods.builtin_tools(run) if self.pods is not None and budget_left > 0 else []
            if builtin:
                names = {tool.name for tool in builtin}
                tools = [tool for tool in tools if tool.name not in names] + builtin
            body: dict[str, Any] = {"model": run.model, "messages": run.messages}
            if tools:
                body["tools"] = [openai_tool(tool) for tool in tools]
                # OpenAI and vLLM refuse parallel_tool_calls without tools, so only send it with them.
                body["parallel_tool_calls"] = run.parallel_tool_calls
            if run.max_tokens > 0:
                body["max_tokens"] = run.max_tokens
            began = time.monotonic()
            try:
                with run_spans.chat(run) as span:
                    reply = await self.dataplane.complete(run, body)
                    run_spans.chat_reply(span, reply)
            finally:
                run.turn_seconds += time.monotonic() - began
            run.turns += 1
            _count_usage(run, reply)
            self._counted()
            _check(run)
            message = _first_message(reply)
            offered = {tool.name: tool for tool in tools}
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list) or not calls:
                content = message.get("content")
                text = content if isinstance(content, str) else ""
                recovered = recover_tool_call(text, offered) if offered else None
                if recovered is None:
                    if run.inbox:  # messages came while it answered: it takes them and goes on
                        run.complete_round([{"role": "assistant", "content": text}])
                        continue
                    return text
                # The call replaces the text in the conversation: a model shown both would see
                # its call twice. The id is ours (the engine emitted none); any unique one works.
                calls = [openai_tool_call(recovered, f"call_{secrets.token_hex(12)}")]
                message = {"content": None}
            toolless_tool_turns = 0 if tools else toolless_tool_turns + 1
            if toolless_tool_turns > MAX_TOOLLESS_TOOL_TURNS:
                raise TurnFailed(
                    f"the model kept calling tools after its tool budget ({run.max_tool_calls}) was spent"
                )
            began = time.monotonic()
            try:
                round_messages = await self._tool_round(run, message, calls, offered)
            finally:
                run.tool_seconds += time.monotonic() - began
            if run.done:  # a budget of its subtree stopped a call of this round
                raise _Stopped
            # Recorded only once the whole round is done: a round is the unit the journal replays;
            # durable before the next turn, so a restart never repeats a completed round.
            run.complete_round(round_messages)
            if run.last_written is not None:
                try:
                    await asyncio.wrap_future(run.last_written)
                except OSError:
                    pass  # logged, and the run marked not durable (runs.py); it goes on

    async def _tool_round(
        self, run: Run, message: dict[str, Any], calls: list[Any], offered: dict[str, Tool]
    ) -> list[dict[str, Any]]:
        """Execute the reply's tool calls, concurrently with ``parallel_tool_calls`` on, else in
        order; the round's messages (the assistant message, then one tool message per call, in
        call order).

        Each call takes one unit of the tool budget in call order, decided before any runs, so a
        concurrent round spends exactly what a sequential one would. The assistant message keeps
        the reply's ``tool_calls`` as they came and every tool message repeats its call's ``id``
        byte for byte: the dataplane and engines match them.
        """
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": message.get("content"),
            "tool_calls": calls,
        }
        spent = run.tool_calls

        async def one(index: int, call: Any) -> dict[str, Any]:
            call_id = call.get("id", "") if isinstance(call, dict) else ""
            within_budget = spent + index < run.max_tool_calls
            # Counted before it runs (in call order, before the first await, also when the
            # calls run concurrently), so a subtree's toolCalls budget is never passed: a call
            # that would pass it cancels the subtree instead of being made.
            if not run.done:
                run.check_budgets({"toolCalls": 1})
            if run.done:
                return {"role": "tool", "tool_call_id": call_id, "content": "Error: the run was stopped"}
            run.tool_calls += 1
            self._counted()
            with run_spans.execute_tool(call) as span:
                text, failed = await self._execute(run, call, offered, within_budget, index)
                run_spans.tool_outcome(span, failed, text)
            if failed:
                run.failed_tool_calls += 1
            return {"role": "tool", "tool_call_id": call_id, "content": text}

        if run.parallel_tool_calls:
            results = list(await asyncio.gather(*(one(i, call) for i, call in enumerate(calls))))
        else:
            results = [await one(i, call) for i, call in enumerate(calls)]
        return [assistant, *results]

    async def _execute(
        self, run: Run, call: Any, offered: dict[str, Tool], within_budget: bool, index: int = 0
    ) -> tuple[str, bool]:
        """One tool call: ``(text for the model, failed)``. Never raises but for cancellation."""
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            return "Error: the tool call names no function", True
        spent = f"Error: the tool budget ({run.max_tool_calls} calls) is spent; answer now"
        tool = offered.get(name)
        if tool is None:
            return (
                (spent, True)
                if not within_budget
                else (f"Error: the tool {name!r} is not offered to you", True)
            )
        if not within_budget:
            return spent, True
        try:
            arguments = prepare_arguments(function.get("arguments"), tool.input_schema or {})
        except ToolArgumentsError as exc:
            return f"Error: invalid arguments for {name}: {exc}", True
        if self.pods is not None and name in {t.name for t in self.pods.builtin_tools(run)}:
            # The run's scope gates the built-in tools, not a person (pods.py).
            return await self.pods.call_builtin(run, name, arguments)
        if self.pods is not None:
            refusal = self.pods.upstream_refusal(run, name, arguments)
            if refusal is not None:
                return refusal, True
        refusal = await self.approval_gate(run, name, arguments, index)
        if refusal is not None:
            return refusal, True
        outcome = await self.upstream.call_tool(name, arguments)
        return outcome.text, outcome.failed
