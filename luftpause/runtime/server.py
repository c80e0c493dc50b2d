"""``luftpause runtime``: the MCP server that drives sub-agents.

Serves, on ``[runtime] listen``:

* ``/mcp``: streamable HTTP MCP (the official ``mcp`` SDK; both protocol eras it serves) with the
  tools of :mod:`luftpause.runtime.mcp.server`; an answer to a client without a caller of its own
  may set the ``luftpause-caller`` cookie (:mod:`luftpause.runtime.mcp.callers`);
* ``GET /status``: JSON ``{"runs": [run], "upstream": [server]}``, the run tree: every run this
  process holds, oldest first, as ``{"id", "name", "state", "parent", "children": [ids], "task" (the first
  200 characters and ``…``; never the whole task), "taskChars", "model", "serviceClass", "caller",
  "error"?, "own": costs, "subtree": costs, "limits"?, "used"?, "exceeded"?}`` where costs are
  ``{"turns", "toolCalls", "failedToolCalls", "promptTokens", "completionTokens", "turnSeconds",
  "toolSeconds"}`` of the run alone and of the run with all its descendants (tokens from each
  turn's ``usage``; seconds spent waiting for turns and in tool rounds). Readable from any origin
  (``Access-Control-Allow-Origin: *``) for the scheduler's live page;
* ``GET /health``: ``{"ok": true}``, always open (no token);
* ``GET /livez`` and ``GET /readyz`` (:mod:`luftpause.serving.health`; ready once the journal is replayed
  and its unfinished runs resumed, unready again while stopping) and ``GET /metrics`` (Prometheus
  text, :mod:`luftpause.runtime.web.metrics`), open like ``/health``;
* ``GET /monitor`` (the page, open: it holds no data) and its JSON and action routes
  ``/monitor/runs...`` (token like ``/status``): the pods monitor (:mod:`luftpause.runtime.web.monitor`).

The routes' JSON errors and ``/status``'s CORS are :mod:`luftpause.runtime.web.status`.

With ``LUFTPAUSE_TOKEN`` set, everything but ``/health``, ``/livez``, ``/readyz``, ``/metrics`` and
the monitor page needs ``Authorization: Bearer <token>``
(:mod:`luftpause.runtime.web.auth`) and the runtime sends the same token to the dataplane. Every HTTP
error the runtime itself answers (401, 404 for an unknown path, 405 with ``Allow``, 500) has the
JSON error body ``{"error": {"message": "..."}}``; ``/mcp``'s own protocol errors are the SDK's
JSON-RPC error objects, which have the same ``error.message``.

The ASGI app runs on granian (one worker process, uvloop). Its parts are built by
:func:`luftpause.runtime.wiring.build_runtime`; its lifespan is :meth:`Runtime.serving` (the
order parts are entered and left, and why interrupted runs are not ended at the dataplane), with
tracing set up first and flushed last. The SDK's session manager only runs because that lifespan
enters it (the SDK app's routes are served inside ours).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

import httpx2
from mcp.server import MCPServer
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from luftpause.auth.callers import load_caller_keys
from luftpause.auth.tls import check_listener, check_peer
from luftpause.config import Config, ConfigError, split_host_port, without_password
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.observe import logs, metrics, tracing
from luftpause.runtime.mcp.callers import CallerCookie
from luftpause.runtime.runs.store import is_postgres, open_stores
from luftpause.runtime.runs.tenants import tenant_in
from luftpause.runtime.web.auth import TOKEN_ENV, BearerTokenGate, token_from_env
from luftpause.runtime.web.mcp_errors import McpErrorBodies, loopback_security
from luftpause.runtime.web.metrics import RuntimeMetrics, readiness
from luftpause.runtime.web.monitor import monitor_routes
from luftpause.runtime.web.status import StatusCors, http_error, internal_error, json_response, mcp_routes
from luftpause.runtime.wiring import Runtime, build_runtime
from luftpause.serving import health as probes
from luftpause.serving.listeners import granian_options, guarded
from luftpause.serving.ports import refuse_if_in_use
from luftpause.supervise.orphans import exit_with_parent
from luftpause.supervise.titles import process_title

log = logging.getLogger("luftpause.runtime")

__all__ = ["Runtime", "add_arguments", "create_app", "run"]


def create_app(
    config: Config, token: str | None = None, *, transport: httpx2.AsyncBaseTransport | None = None
) -> Starlette:
    """The runtime's ASGI app for ``config``: ``/mcp``, ``GET /status``, ``GET /metrics``,
    ``/livez``, ``/readyz``, ``GET /health``, the monitor; its
    :class:`~luftpause.runtime.wiring.Runtime` is ``app.state.runtime``.

    ``token`` is the shared ``LUFTPAUSE_TOKEN`` (default: read from the environment); with one,
    every path but the open ones (``/health``, ``/livez``, ``/readyz``, ``/metrics``, the monitor
    page) requires it and turns sent to the dataplane carry it. ``transport``
    replaces the network to the dataplane (tests).
    """
    token = (token if token is not None else token_from_env()) or None
    keys = load_caller_keys(config)  # the dataplane's key table: tenants (docs/security-tenants.md)
    runtime = build_runtime(config, token, transport=transport)
    host, _ = split_host_port(config.runtime.listen)
    # The SDK turns on DNS-rebinding protection for loopback hosts itself; bound elsewhere, the
    # operator's network decides who may connect (REFERENCES.md, "transport_security").
    mcp_app = runtime.mcp.streamable_http_app(host=host, transport_security=loopback_security(host))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        exit_with_parent()  # granian's worker: a SIGKILLed main process must not leave it serving
        if keys is not None:
            log.info(
                "caller keys (%d): /mcp, /status and the monitor take them; each sees its tenant's runs",
                len(keys),
            )
        elif token is None:
            log.warning("%s is not set: /mcp and /status accept every request without a token", TOKEN_ENV)
        async with AsyncExitStack() as stack:
            # Spans over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, from the worker that makes
            # them; flushed last, after every run has stopped.
            if tracing.setup(tracing.RUNTIME_SERVICE):
                stack.callback(tracing.shutdown)
            await stack.enter_async_context(runtime.serving())
            logs.announce("runtime", f"luftpause runtime: MCP on {runtime.mcp_url}")
            yield

    async def status(request: Request) -> Response:
        return json_response(runtime.status(tenant_in(request.scope)))

    async def health(request: Request) -> Response:
        return json_response({"ok": True})

    def probe_answer(answer: tuple[int, bytes]) -> Response:
        code, body = answer
        return Response(body, status_code=code, media_type=probes.CONTENT_TYPE)

    async def livez(request: Request) -> Response:
        return probe_answer(probes.LIVE)

    async def readyz(request: Request) -> Response:
        return probe_answer(probes.report(readiness(runtime.registry)))

    registry = metrics.new_registry(
        [
            RuntimeMetrics(
                runtime.registry,
                runtime.journal,
                runtime.loop.counts,
                upstream=lambda: [(server.name, server.connected) for server in runtime.upstream.servers],
                mcp_sessions=lambda: mcp_sessions(runtime.mcp),
            )
        ]
    )

    async def exposition(request: Request) -> Response:
        return Response(metrics.exposition(registry), headers={"content-type": metrics.CONTENT_TYPE})

    app = Starlette(
        routes=[
            Route("/status", status, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/livez", livez, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", exposition, methods=["GET"]),
            *monitor_routes(runtime.pods, host, runtime.series),
            *mcp_routes(mcp_app),
        ],
        middleware=[
            Middleware(StatusCors, scheduler_http=config.scheduler.http, listen_host=host),
            Middleware(BearerTokenGate, token=token, jsonrpc_paths=frozenset({"/mcp"}), keys=keys),
            Middleware(CallerCookie, path="/mcp"),
            Middleware(McpErrorBodies, path="/mcp"),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    return app


def mcp_sessions(server: MCPServer) -> int:
    """The MCP sessions the SDK's session manager holds open now (its ``_server_instances``: the
    SDK names no public count; ``tests/stack/test_metrics_scraped_by_prometheus.py`` fails when
    that changes)."""
    instances = getattr(server.session_manager, "_server_instances", None)
    return len(instances) if isinstance(instances, dict) else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 then, 2 for a bad configuration (an unwritable
    ``[runtime] state_dir`` too: one line on stderr naming it and the OS error)."""
    config = config_from_args(args)
    try:
        check_listener(config.runtime.tls, "runtime.tls")
        check_peer(config.runtime.dataplane_tls, "runtime.dataplane_tls")
    except ConfigError as exc:
        logs.announce("runtime", f"luftpause runtime: {exc}", level=logging.ERROR, stream=sys.stderr)
        return 2
    refuse_if_in_use("runtime", config.runtime.listen)
    try:  # before granian's worker starts the stdio MCP servers: one line, not a traceback
        stores = open_stores(config.runtime)
        stores.runs.check_writable()
    except OSError as exc:  # StoreUnusable too: unreachable, a newer schema, psycopg missing
        where = (
            f"store {without_password(config.runtime.store)!r}"
            if is_postgres(config.runtime.store)
            else f"state_dir {config.runtime.state_dir!r}"
        )
        logs.announce(
            "runtime",
            f"luftpause runtime: [runtime] {where}: {exc}",
            level=logging.ERROR,
            stream=sys.stderr,
        )
        return 2
    # Our own INFO lines (upstream connections, failed runs); the libraries' per-request INFO
    # lines (httpx, the SDK) would bury them. Another --log-level (debug: those lines too) is kept.
    level = logs.current_level()
    root_level = logging.WARNING if level == logging.INFO else level
    logging.getLogger().setLevel(root_level)
    logging.getLogger("luftpause").setLevel(level)
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    host, port = split_host_port(config.runtime.listen)
    server = Granian(
        "luftpause.runtime.server:create_app",  # a label only: the loader below builds the app
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        workers=1,
        log_level=LogLevels.warning,
        process_name=process_title(),
        log_dictconfig=logs.granian_log_config("runtime", root_level),
        **granian_options(config.runtime.limits, config.runtime.tls),
    )
    # The app behind the listener guard (luftpause.serving.listeners: body deadline, requests at once, stop).
    loader = partial(guarded, partial(create_app, config), config.runtime.limits, "runtime")
    server.serve(target_loader=loader, wrap_loader=False)
    return 0
