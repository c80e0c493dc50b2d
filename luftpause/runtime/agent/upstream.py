"""The upstream MCP tool servers the sub-agents call (``[[mcp_servers]]`` in the configuration).

Each server gets one connected ``mcp.Client`` for the runtime's lifetime: streamable HTTP for a
``url``, a child process over stdio for a ``command`` (``StdioServerParameters``; the child gets the
SDK's safe default environment plus the entry's ``env``). The client is entered and left by one
long-lived *keeper* task per server, because the SDK's clients hold anyio task groups that must be
left by the task that entered them; runs only borrow the connected client.

Call ids: every call carries ``io.luftpause/call-id`` in its request's ``_meta`` (:func:`call_id`:
the run's handle, the turn that asked for it and its index in that reply), the same when a restart
makes the call again. Delivery is at least once: a call whose completion the journal holds is never
made again, but a call in flight at a crash (its completion not journaled) is made again after the
restart, with the same id, so a server whose tools must not run twice can deduplicate on it
(docs/architecture.md "Runs and their journal").

A server that cannot be reached, or whose connection ends (a stdio server that exits), is tried
again by its keeper with backoff (:data:`BACKOFF_FIRST_SECONDS` doubling to
:data:`BACKOFF_MAX_SECONDS`, back to the first delay after a connection that lasted
:data:`STABLE_SECONDS`), and sooner when a run asks for it and the last attempt is
:data:`RETRY_SECONDS` old; so a tool server started after the runtime is picked up without a
restart. A call in flight when its server goes away fails at once with an error result (the SDK
answers every pending request ``Connection closed`` at the end of the stream); it is never sent
again by the runtime: the model decides whether to call again.

Timeouts: a tool call may take :data:`TOOL_CALL_TIMEOUT_SECONDS`. The SDK's default HTTP client
would cut a call whose stream stays silent for 300 s (httpx2 ``read``), so HTTP servers get a
client whose read and pool timeouts are that long too (connect and write stay at the SDK's 30 s).

Tool shapes come from the MCP spec (``tools/list``: ``name``, ``description``, ``inputSchema``); they
are offered to the model as OpenAI function tools (``{"type": "function", "function": {"name",
"description", "parameters"}}``, OpenAI chat completions API, ``tools``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client._transport import TransportStreams
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_TIMEOUT, create_mcp_http_client
from mcp.types import CallToolResult, Implementation, RequestParamsMeta, TextContent, Tool

from luftpause import __version__
from luftpause.config import McpServerConfig
from luftpause.observe import tracing
from luftpause.runtime.agent import spans as run_spans
from luftpause.runtime.errors import UpstreamUnavailable

log = logging.getLogger("luftpause.runtime.agent.upstream")

RETRY_SECONDS = 5.0
"""A run asking for a server that is down wakes its keeper only when the last attempt is at least
this old (seconds); otherwise the keeper's backoff decides."""

BACKOFF_FIRST_SECONDS = 0.5
"""Delay before the first new attempt after a failed connection or a lost one (seconds)."""

BACKOFF_MAX_SECONDS = 30.0
"""The delay doubles after every failed attempt up to this (seconds)."""

STABLE_SECONDS = 30.0
"""A connection that lasted this long resets the delay to :data:`BACKOFF_FIRST_SECONDS` when it
ends (seconds): a server that crashes now and then restarts at once, a crash loop slows down."""

START_WAIT_SECONDS = 10.0
"""How long the runtime's start waits for the first connection attempt of every server (seconds)."""

TOOL_CALL_TIMEOUT_SECONDS = 600.0
"""Longest one upstream tool call may take before it counts as failed (seconds)."""

_CLIENT_INFO = Implementation(name="luftpause-runtime", version=__version__)

CALL_ID_META = "io.luftpause/call-id"
"""The ``_meta`` key of a tool call's request that carries its id (:func:`call_id`)."""


def call_id(handle: str, turn: int, index: int) -> str:
    """The id of the ``index``-th call (0-based) of the reply to turn ``turn`` (1-based: the run's
    turn count) of run ``handle``: ``<handle>:<turn>:<index>``, e.g. ``run-0f3a9c2e4b1d6a7e:3:0``.
    Stable across a restart: a resumed round keeps its turn
    (:class:`~luftpause.runtime.runs.record.PendingRound`), so a call made again carries the id it
    had. A server should treat it as an opaque string."""
    return f"{handle}:{turn}:{index}"


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one tool call gave back: the text for the model, whether it failed, and the name of
    the server it went to (``""``: none offers the tool)."""

    text: str
    failed: bool
    server: str = ""


def openai_tool(tool: Tool) -> dict[str, Any]:
    """An MCP tool as an OpenAI chat-completions function tool."""
    schema = tool.input_schema or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description or "", "parameters": schema},
    }


def result_text(result: CallToolResult) -> str:
    """The text of an MCP tool result: text blocks joined by newlines, other blocks as JSON;
    ``structuredContent`` as JSON when there is no content block."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            parts.append(block.model_dump_json(by_alias=True, exclude_none=True))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def _as_error(text: str) -> str:
    return text if text.lower().startswith("error") else f"Error: {text}"


def tool_listing(tool: Tool) -> dict[str, Any]:
    """One tool as the ``tools`` MCP tool shows it (MCP ``Tool`` wire names)::

    {"name", "description", "inputSchema", "annotations": {"readOnlyHint"?, "destructiveHint"?,
     "idempotentHint"?, "openWorldHint"?, "title"?}}

    Annotations are what the server declared (MCP spec: untrusted hints); absent ones take the
    spec's defaults (``readOnlyHint`` false, ``destructiveHint`` true).
    """
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    return {
        "name": tool.name,
        "description": tool.description or "",
        "inputSchema": tool.input_schema,
        "annotations": annotations,
    }


class _EndWatchingStream:
    """A transport's read stream that calls ``on_end`` when it ends (end of stream, or closed):
    for stdio, the server process exited. Everything else is passed through, including the
    sender's ``last_context`` the SDK's dispatcher looks for (``mcp.shared._context_streams``)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _EndWatchingStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _EndWatchingStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched_transport(
    inner: AbstractAsyncContextManager[TransportStreams],
    on_end: Callable[[], None],
    http_client: httpx2.AsyncClient | None = None,
) -> AsyncIterator[TransportStreams]:
    """``inner`` (an SDK transport) with its read stream watched for its end; ``http_client``,
    when given, is opened before it and closed after it (the SDK leaves a client it was given
    to its owner)."""
    async with AsyncExitStack() as stack:
        if http_client is not None:
            await stack.enter_async_context(http_client)
        read_stream, write_stream = await stack.enter_async_context(inner)
        yield _EndWatchingStream(read_stream, on_end), write_stream


async def _first_of(*waits: Awaitable[Any]) -> None:
    """Wait until the first of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _traceparent_header(request: httpx2.Request) -> None:
    """Send a JSON-RPC request's ``params._meta.traceparent`` (W3C, put there by the SDK and by
    :func:`luftpause.runtime.agent.spans.current_meta`) as the HTTP ``traceparent`` header too, so
    HTTP-level tracing at the tool server sees the tool call's span. Only while tracing."""
    if not tracing.active or request.method != "POST":
        return
    try:
        content = request.content  # a streamed body (none of the SDK's) has none to read
    except httpx2.RequestNotRead:
        return
    if b'"traceparent"' not in content:
        return
    try:
        message = json.loads(content)
    except ValueError:
        return
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    value = meta.get(tracing.TRACEPARENT) if isinstance(meta, dict) else None
    if isinstance(value, str) and value:
        request.headers[tracing.TRACEPARENT] = value


class UpstreamServer:
    """One configured MCP server, its connected client (when it is) and its listed tools."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.name = config.name
        self.client: Client | None = None
        self.tools: list[Tool] = []
        self.last_error: str | None = None
        self._last_attempt = 0.0
        self._attempt_wanted = asyncio.Event()
        self._attempted = asyncio.Event()  # replaced after every attempt, like RunRegistry._changed
        self._stop = asyncio.Event()
        self._lost = asyncio.Event()  # set when the current connection's stream ends
        self.restarts = 0
        """Connections that ended on the server's side (a stdio server that exited) and were
        tried again."""

    @property
    def target(self) -> str:
        """The URL or the command line, for messages."""
        return self.config.url or " ".join(self.config.command or ())

    @property
    def transport(self) -> str:
        """``"http"`` or ``"stdio"``."""
        return "http" if self.config.url is not None else "stdio"

    @property
    def connected(self) -> bool:
        return self.client is not None and not self._lost.is_set()

    def _new_client(self, lost: asyncio.Event) -> Client:
        transport: AbstractAsyncContextManager[TransportStreams]
        http_client: httpx2.AsyncClient | None = None
        if self.config.url is not None:
            http_client = create_mcp_http_client(
                timeout=httpx2.Timeout(
                    MCP_DEFAULT_TIMEOUT, read=TOOL_CALL_TIMEOUT_SECONDS, pool=TOOL_CALL_TIMEOUT_SECONDS
                )
            )
            # The SDK's HTTP headers are per session: each POST gets its traceparent from its body.
            http_client.event_hooks["request"].append(_traceparent_header)
            transport = streamable_http_client(self.config.url, http_client=http_client)
        else:
            command = list(self.config.command or ())
            params = StdioServerParameters(
                command=command[0], args=command[1:], env=dict(self.config.env) or None
            )
            transport = stdio_client(params)
        return Client(_watched_transport(transport, lost.set, http_client), client_info=_CLIENT_INFO)

    async def _list_tools(self, client: Client) -> list[Tool]:
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a server whose pagination never ends cannot hang the runtime
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    def _attempt_finished(self) -> None:
        attempted, self._attempted = self._attempted, asyncio.Event()
        attempted.set()

    async def keep_connected(self) -> None:
        """Connect, list tools, hold the client until :meth:`stop` or until the connection ends;
        after a failure or a lost connection, try again with backoff (module docstring). Runs as
        one task for the runtime's lifetime."""
        delay = BACKOFF_FIRST_SECONDS
        while not self._stop.is_set():
            self._last_attempt = time.monotonic()
            lost = asyncio.Event()
            connected_at: float | None = None
            try:
                async with self._new_client(lost) as client:
                    self.tools = await self._list_tools(client)
                    self.client, self._lost = client, lost
                    self.last_error = None
                    connected_at = time.monotonic()
                    log.info("MCP server %s (%s): %d tools", self.name, self.target, len(self.tools))
                    self._attempt_finished()
                    await _first_of(self._stop.wait(), lost.wait())
                    if not self._stop.is_set():
                        self.restarts += 1
                        self.last_error = "the connection ended (the server exited or closed it)"
                        log.warning(
                            "MCP server %s (%s): the connection ended; connecting again",
                            self.name,
                            self.target,
                        )
            except Exception as exc:
                self.last_error = _describe(exc)
                log.warning("MCP server %s (%s) unavailable: %s", self.name, self.target, self.last_error)
            finally:
                self.client = None
            self._attempt_finished()
            if self._stop.is_set():
                return
            if connected_at is not None and time.monotonic() - connected_at >= STABLE_SECONDS:
                delay = BACKOFF_FIRST_SECONDS
            await _first_of(self._stop.wait(), self._attempt_wanted.wait(), asyncio.sleep(delay))
            self._attempt_wanted.clear()
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def first_attempt(self) -> None:
        """Return once the first connection attempt has succeeded or failed."""
        if self._last_attempt and (self.connected or self.last_error is not None):
            return
        await self._attempted.wait()

    async def ensure_connected(self) -> Client:
        """The connected client; if there is none, one more attempt unless the last one is less
        than :data:`RETRY_SECONDS` old. Raises :class:`UpstreamUnavailable`."""
        if self.client is not None and self.connected:
            return self.client
        if time.monotonic() - self._last_attempt >= RETRY_SECONDS and not self._stop.is_set():
            attempted = self._attempted
            self._attempt_wanted.set()
            await attempted.wait()
        if self.client is None or not self.connected:
            raise UpstreamUnavailable(f"MCP server {self.name} ({self.target}): {self.last_error}")
        return self.client

    def stop(self) -> None:
        self._stop.set()


def _describe(exc: BaseException) -> str:
    # The SDK's transports raise exception groups; the leaf says what actually went wrong.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


class UpstreamPool:
    """All configured MCP servers, as one set of tools by name.

    Use as an async context manager in the server's lifespan: entering starts every keeper task
    and waits (at most :data:`START_WAIT_SECONDS`) for each first attempt; leaving disconnects.
    When two servers offer a tool of the same name, the one configured first wins.
    """

    def __init__(self, configs: Iterable[McpServerConfig]) -> None:
        self.servers = [UpstreamServer(config) for config in configs]
        self._group: asyncio.TaskGroup | None = None

    async def __aenter__(self) -> UpstreamPool:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        for server in self.servers:
            self._group.create_task(server.keep_connected(), name=f"mcp-upstream-{server.name}")
        if self.servers:
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(s.first_attempt() for s in self.servers)), START_WAIT_SECONDS
                )
            except TimeoutError:
                log.warning(
                    "some MCP servers did not answer within %.0f s; trying again on use", START_WAIT_SECONDS
                )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in self.servers:
            server.stop()
        group, self._group = self._group, None
        if group is not None:
            await group.__aexit__(exc_type, exc, tb)

    async def _reconnect_missing(self) -> None:
        missing = [s for s in self.servers if not s.connected]
        if missing:
            await asyncio.gather(*(s.ensure_connected() for s in missing), return_exceptions=True)

    def _index(self) -> dict[str, tuple[UpstreamServer, Tool]]:
        index: dict[str, tuple[UpstreamServer, Tool]] = {}
        for server in self.servers:
            if server.connected:
                for tool in server.tools:
                    index.setdefault(tool.name, (server, tool))
        return index

    def tool_named(self, name: str) -> Tool | None:
        """The listed tool a call of ``name`` goes to (the first connected server listing it), or
        ``None``."""
        entry = self._index().get(name)
        return entry[1] if entry is not None else None

    def known_tool_names(self) -> set[str] | None:
        """Names of every listed tool, or ``None`` while some server is unreachable (its tools
        are unknown, so no name can be ruled out)."""
        if any(not s.connected for s in self.servers):
            return None
        return set(self._index())

    async def offered_tools(self, allowed: frozenset[str] | None) -> list[Tool]:
        """The tools a run may use now: all listed tools, or those named in ``allowed``.

        Servers that are not connected are tried again first (see :data:`RETRY_SECONDS`); those
        still unreachable offer nothing this turn.
        """
        await self._reconnect_missing()
        return [tool for name, (_, tool) in self._index().items() if allowed is None or name in allowed]

    async def call_tool(self, name: str, arguments: dict[str, Any], call: str | None = None) -> ToolOutcome:
        """Call ``name`` on the server that lists it, with ``call`` (:func:`call_id`) as the
        request's ``_meta`` :data:`CALL_ID_META`. Never raises for a failed call: an MCP
        ``isError`` result, an unreachable server or a transport error come back as a failed
        :class:`ToolOutcome` whose text begins ``Error``."""
        entry = self._index().get(name)
        if entry is None:
            return ToolOutcome(f"Error: no MCP server offers the tool {name!r}", failed=True)
        server, _ = entry
        meta = run_spans.current_meta()  # the execute_tool span, when tracing
        if call is not None:
            meta = cast("RequestParamsMeta", {**(meta or {}), CALL_ID_META: call})
        try:
            client = await server.ensure_connected()
            result = await client.call_tool(
                name, arguments, read_timeout_seconds=TOOL_CALL_TIMEOUT_SECONDS, meta=meta
            )
        except Exception as exc:
            where = f"tool {name} on MCP server {server.name}"
            return ToolOutcome(f"Error: {where}: {_describe(exc)}", failed=True, server=server.name)
        text = result_text(result)
        if result.is_error:
            return ToolOutcome(
                _as_error(text or "the tool reported an error"), failed=True, server=server.name
            )
        return ToolOutcome(text, failed=False, server=server.name)

    def catalog(self, allowed: frozenset[str] | None) -> list[dict[str, Any]]:
        """The tools a sub-agent allowed ``allowed`` (``None``: every tool) may use, by server, in
        configuration order (the ``tools`` MCP tool)::

            [{"server", "transport": "http" | "stdio", "reachable": bool, "error"?: str,
              "tools": [tool_listing(tool)]}]

        An unreachable server shows the tools it listed when it was last connected (none if it
        never was), with ``reachable: false`` and the last error: a run is offered them again once
        it is back. A tool whose name an earlier server already lists is left out: calls by that
        name go to the earlier server.
        """
        seen: set[str] = set()
        out: list[dict[str, Any]] = []
        for server in self.servers:
            listed = []
            for tool in server.tools:
                if tool.name in seen:
                    continue
                seen.add(tool.name)
                if allowed is None or tool.name in allowed:
                    listed.append(tool_listing(tool))
            item: dict[str, Any] = {
                "server": server.name,
                "transport": server.transport,
                "reachable": server.connected,
            }
            if not server.connected and server.last_error is not None:
                item["error"] = server.last_error
            item["tools"] = listed
            out.append(item)
        return out

    def describe(self) -> list[dict[str, Any]]:
        """Per server: ``name``, ``target``, ``connected``, ``tools`` (names), ``error``."""
        return [
            {
                "name": s.name,
                "target": s.target,
                "connected": s.connected,
                "tools": [t.name for t in s.tools] if s.connected else [],
                "error": s.last_error,
            }
            for s in self.servers
        ]
