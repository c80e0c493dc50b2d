"""``luftpause fake-mcp``: an MCP tool server with two read-only tools, for tests and benchmarks.

* ``lookup(query)``: answers after 10-50 ms with a paragraph about the query;
* ``deep_search(query, depth=2)``: answers after 100-300 ms with ``depth`` paragraphs.

With ``--destructive`` it also serves ``delete_note(title)``, marked ``destructiveHint: true``
(answers after :data:`DELETE_NOTE_DELAY_S`), so a runtime's approval of destructive calls can be
tested; it is off by default so that the read-only tools are all a sub-agent is ever offered.

``GET /testkit/calls`` answers ``{"<tool> <query>": calls started}``, so a test can count how
often each call was made; ``GET /testkit/call-ids`` answers ``{"<call id>": calls started}`` for
the calls whose request carried an id in its ``_meta`` (``io.luftpause/call-id``, the runtime's:
:func:`luftpause.runtime.agent.upstream.call_id`), so a test can tell a call made again from a new
one, as a server deduplicating on it would. ``POST /testkit/hold/<query>`` makes every ``lookup``
and ``deep_search`` of that query started from then on wait, after its delay, until ``POST
/testkit/release/<query>``. ``POST /testkit/delete_note/hold`` makes every ``delete_note`` call
started from then on wait, after its :data:`DELETE_NOTE_DELAY_S`, until ``POST
/testkit/delete_note/release`` (so a test can act while a call is surely in flight). Both tools
are marked ``readOnlyHint: true`` (MCP tool annotations), so a runtime never asks for approval
before calling them. Built with the official SDK (``mcp`` 2.3, ``MCPServer``) and served over
streamable HTTP at ``/mcp`` by uvicorn, which answers both protocol eras the SDK serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Annotated

import anyio
import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from luftpause.observe import logs
from luftpause.serving.ports import port_number

TOOL_NAMES = ("lookup", "deep_search")

# Seconds a tool takes: a quick lookup and a slower search.
LOOKUP_DELAY_S = (0.010, 0.050)
DEEP_SEARCH_DELAY_S = (0.100, 0.300)
# Slow on purpose: a test can kill a runtime while an approved call is still in flight.
DELETE_NOTE_DELAY_S = 1.0

CALL_ID_META = "io.luftpause/call-id"
"""The ``_meta`` key whose value the server counts calls by (the runtime's call id)."""

# Seconds uvicorn waits for open connections (MCP's long-lived GET streams) at shutdown.
SHUTDOWN_GRACE_S = 1

_SENTENCES = (
    "Sources describe {q} as a recurring subject with a long record of discussion.",
    "Most accounts of {q} agree on the broad outline while differing in the details.",
    "Recent material on {q} adds measurements that were not available before.",
    "Several reviews of {q} point to the same small set of primary references.",
    "Practitioners who work with {q} report that the common summaries hold up well.",
    "An older view of {q} has largely given way to a more careful reading of the data.",
    "Comparisons between {q} and related topics show more overlap than expected.",
    "Open questions about {q} remain, mostly about edge cases and rare conditions.",
)


def _paragraph(rng: random.Random, query: str, sentences: int) -> str:
    return " ".join(rng.choice(_SENTENCES).format(q=query) for _ in range(sentences))


def build_server(seed: int | None = 0, destructive: bool = False) -> MCPServer:
    """The fake tool server: ``lookup`` and ``deep_search`` (and ``delete_note`` with
    ``destructive``); ``seed`` fixes delays and text (``None``: fresh randomness)."""
    rng = random.Random(seed)
    server = MCPServer(
        "luftpause-fake-mcp",
        instructions="Simulated research tools: lookup for quick facts, deep_search for longer digging.",
        log_level="WARNING",
    )
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
    calls: Counter[str] = Counter()
    call_ids: Counter[str] = Counter()
    held: dict[str, anyio.Event] = {}  # query -> the gate its calls wait at until released

    @server.custom_route("/testkit/calls", methods=["GET"])  # type: ignore[untyped-decorator]  # SDK: unannotated
    async def count(request: Request) -> JSONResponse:
        return JSONResponse(dict(calls))

    @server.custom_route("/testkit/call-ids", methods=["GET"])  # type: ignore[untyped-decorator]  # SDK: unannotated
    async def count_ids(request: Request) -> JSONResponse:
        return JSONResponse(dict(call_ids))

    @server.custom_route("/testkit/hold/{query}", methods=["POST"])  # type: ignore[untyped-decorator]  # SDK: unannotated
    async def hold_query(request: Request) -> JSONResponse:
        held.setdefault(request.path_params["query"], anyio.Event())
        return JSONResponse({"held": sorted(held)})

    @server.custom_route("/testkit/release/{query}", methods=["POST"])  # type: ignore[untyped-decorator]  # SDK: unannotated
    async def release_query(request: Request) -> JSONResponse:
        gate = held.pop(request.path_params["query"], None)
        if gate is not None:
            gate.set()
        return JSONResponse({"held": sorted(held)})

    def started(tool: str, query: str, ctx: Context) -> anyio.Event | None:
        """Count the call (by tool and query, and by its id); the gate it waits at, if held."""
        calls[f"{tool} {query}"] += 1
        meta = ctx.request_context.meta
        called = meta.get(CALL_ID_META) if isinstance(meta, dict) else None
        if isinstance(called, str):
            call_ids[called] += 1
        return held.get(query)

    async def lookup(
        query: Annotated[str, Field(description="What to look up, in a few words.")], ctx: Context
    ) -> str:
        gate = started("lookup", query, ctx)
        await anyio.sleep(rng.uniform(*LOOKUP_DELAY_S))
        if gate is not None:
            await gate.wait()
        return f"Lookup: {query}. " + _paragraph(rng, query, 3)

    async def deep_search(
        query: Annotated[str, Field(description="The question to research.")],
        ctx: Context,
        depth: Annotated[
            int, Field(ge=1, le=5, description="How many layers of sources to follow (1-5).")
        ] = 2,
    ) -> str:
        gate = started("deep_search", query, ctx)
        await anyio.sleep(rng.uniform(*DEEP_SEARCH_DELAY_S))
        if gate is not None:
            await gate.wait()
        sections = [f"Layer {layer}: " + _paragraph(rng, query, 4) for layer in range(1, depth + 1)]
        return f"Deep search: {query} (depth {depth}).\n\n" + "\n\n".join(sections)

    server.add_tool(
        lookup,
        description="Look up a short factual paragraph about a query. Fast (tens of milliseconds).",
        annotations=read_only,
        structured_output=False,
    )
    server.add_tool(
        deep_search,
        description=(
            "Research a query in depth and return several paragraphs, one per layer of sources. "
            "Slower than lookup (a few hundred milliseconds)."
        ),
        annotations=read_only,
        structured_output=False,
    )
    if destructive:
        released = [anyio.Event()]  # the gate of the calls held; set: none held
        released[0].set()

        @server.custom_route("/testkit/delete_note/hold", methods=["POST"])  # type: ignore[untyped-decorator]  # SDK: unannotated
        async def hold(request: Request) -> JSONResponse:
            if released[0].is_set():
                released[0] = anyio.Event()
            return JSONResponse({"held": True})

        @server.custom_route("/testkit/delete_note/release", methods=["POST"])  # type: ignore[untyped-decorator]  # SDK: unannotated
        async def release(request: Request) -> JSONResponse:
            released[0].set()
            return JSONResponse({"held": False})

        async def delete_note(
            title: Annotated[str, Field(description="Title of the note.")], ctx: Context
        ) -> str:
            started("delete_note", title, ctx)
            gate = released[0]
            await anyio.sleep(DELETE_NOTE_DELAY_S)
            await gate.wait()
            return f"Deleted the note {title!r}."

        server.add_tool(
            delete_note,
            description="Delete a note for good.",
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
            structured_output=False,
        )
    return server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``fake-mcp`` flags."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port", type=port_number, default=7100, help="port to listen on, 1-65535 (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="fixes the tools' delays and text (default: %(default)s)"
    )
    parser.add_argument(
        "--destructive", action="store_true", help="also serve delete_note, marked destructiveHint: true"
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 on a clean stop, 2 when the port cannot be bound."""
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        logs.announce(
            "fake-mcp",
            f"luftpause fake-mcp: cannot listen on {args.host}:{args.port}: {exc}",
            level=logging.ERROR,
        )
        return 2
    return asyncio.run(_serve(build_server(args.seed, args.destructive), args.host, sock))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: it re-raises SIGTERM after a graceful stop, so the
    process would die by the signal instead of exiting 0; ``_serve`` handles the signals."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()


async def _serve(server: MCPServer, host: str, sock: socket.socket) -> int:
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(
        app,
        log_level="warning",
        log_config=None,  # uvicorn's records through the root handler (JSON with --log-format json)
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    web = _Server(config)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        web.should_exit = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop)
    serving = asyncio.create_task(web.serve(sockets=[sock]))
    listening = asyncio.create_task(web.listening.wait())
    await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    if web.started:
        bound_host, port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        logs.announce(
            "fake-mcp", f"luftpause fake-mcp: serving {', '.join(TOOL_NAMES)} on http://{shown}:{port}/mcp"
        )
    try:
        await serving
    except SystemExit as exc:  # uvicorn exits this way when its startup fails
        return int(exc.code or 1)
    finally:
        sock.close()
    return 0
