"""``luftpause runtime``: the MCP server that drives sub-agents.

Serves, on ``[runtime] listen``:

* ``/mcp``: streamable HTTP MCP (the official ``mcp`` SDK; both protocol eras it serves) with the
  tools of :mod:`luftpause.runtime.tools`;
* ``GET /status``: JSON ``{"runs": [run], "upstream": [server]}``, the run tree: every run this
  process holds, oldest first, as ``{"id", "state", "parent", "children": [ids], "task" (the first
  200 characters and ``…``; never the whole task), "taskChars", "model", "serviceClass", "caller",
  "error"?, "own": costs, "subtree": costs, "limits"?, "used"?, "exceeded"?}`` where costs are
  ``{"turns", "toolCalls", "failedToolCalls", "promptTokens", "completionTokens", "turnSeconds",
  "toolSeconds"}`` of the run alone and of the run with all its descendants (tokens from each
  turn's ``usage``; seconds spent waiting for turns and in tool rounds). Readable from any origin
  (``Access-Control-Allow-Origin: *``) for the scheduler's live page;
* ``GET /health``: ``{"ok": true}``, always open (no token);
* ``GET /monitor`` (the page, open: it holds no data) and its JSON and action routes
  ``/monitor/runs...`` (token like ``/status``): the pods monitor (:mod:`luftpause.runtime.monitor`).

With ``LUFTPAUSE_TOKEN`` set, everything but ``/health`` needs ``Authorization: Bearer <token>``
(:mod:`luftpause.runtime.auth`) and the runtime sends the same token to the dataplane. Every HTTP
error the runtime itself answers (401, 404 for an unknown path, 405 with ``Allow``, 500) has the
JSON error body ``{"error": {"message": "..."}}``; ``/mcp``'s own protocol errors are the SDK's
JSON-RPC error objects, which have the same ``error.message``.

The ASGI app runs on granian (one worker process, uvloop). Its lifespan owns everything that
outlives a request, in this order: the shared aiohttp session to the dataplane, the upstream MCP
clients, the run registry (which replays the journal ``<state_dir>/runs.jsonl`` and resumes the
unfinished runs, :mod:`luftpause.runtime.journal`), the task registry (``<state_dir>/tasks.jsonl``,
:mod:`luftpause.runtime.tasks`; tasks open at the last stop are failed), and the SDK's session
manager (which, with the SDK app mounted inside ours, only runs if our lifespan enters it). On
shutdown they are left in reverse: the registry cancels the runs still going without journaling
an end for them, so they resume on the next start. They are deliberately *not* ended at the
dataplane: the scheduler keeps their affinity (last replica, prefix cache) and, for a run paused
on a tool, its headroom slot until the runtime is back (or its 30 min run idle expiry, if it never
comes back). A run the shutdown interrupts is therefore treated exactly like one a crash
interrupts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from luftpause import logs, tracing
from luftpause.auth.tls import check_listener, check_peer, client_context
from luftpause.cli import add_config_argument, config_from_args, process_title
from luftpause.config import Config, ConfigError, split_host_port
from luftpause.listeners import granian_options, guarded
from luftpause.orphans import exit_with_parent
from luftpause.ports import refuse_if_in_use
from luftpause.runtime.approvals import Approvals
from luftpause.runtime.auth import TOKEN_ENV, BearerTokenGate, error_body, token_from_env
from luftpause.runtime.decide import Decider
from luftpause.runtime.journal import Journal, encode
from luftpause.runtime.loop import DataplaneClient, SubAgentLoop, new_http_session
from luftpause.runtime.monitor import host_allowed, monitor_routes
from luftpause.runtime.pods import Pods
from luftpause.runtime.runs import RunRegistry
from luftpause.runtime.tasks import TaskRegistry, TasksExtension
from luftpause.runtime.tools import build_mcp_server
from luftpause.runtime.upstream import UpstreamPool

log = logging.getLogger("luftpause.runtime")


class Runtime:
    """The state of one runtime process: configuration, runs, upstream tools and the loop.

    ``loop`` and ``decider`` exist only inside the lifespan (they need the HTTP session the
    lifespan opens). ``approvals`` is the loop's approval gate (:mod:`luftpause.runtime.approvals`).
    """

    def __init__(self, config: Config, token: str | None = None) -> None:
        self.config = config
        self.token = token
        self.journal = Journal(Path(config.runtime.state_dir))
        self.registry = RunRegistry(journal=self.journal, retained_bytes=config.runtime.retained_bytes)
        self.upstream = UpstreamPool(config.mcp_servers)
        self.approvals = Approvals(self.registry, self.upstream)
        self.pods = Pods(self.registry, config)
        self.tasks = TaskRegistry(Path(config.runtime.state_dir), self.registry, self.approvals)
        self._loop: SubAgentLoop | None = None
        self._decider: Decider | None = None

    def mcp_extensions(self) -> list[Any]:
        """The MCP extensions the runtime's server offers (SDK ``Extension`` instances): Tasks
        (:mod:`luftpause.runtime.tasks`)."""
        return [TasksExtension(self.tasks)]

    @property
    def decider(self) -> Decider:
        if self._decider is None:
            raise RuntimeError("the runtime is not started (outside its lifespan)")
        return self._decider

    @property
    def loop(self) -> SubAgentLoop:
        if self._loop is None:
            raise RuntimeError("the runtime is not started (outside its lifespan)")
        return self._loop

    @property
    def mcp_url(self) -> str:
        host, port = split_host_port(self.config.runtime.listen)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/mcp"

    def status(self) -> dict[str, Any]:
        """``GET /status``: ``{"runs": RunRegistry.tree(), "upstream": [UpstreamPool.describe()
        item]}``; each run's task is summarized (:func:`luftpause.runtime.runs.summarize`)."""
        return {
            "runs": self.registry.tree(),
            "upstream": self.upstream.describe(),
        }


def json_bytes(data: Any) -> bytes:
    """``data`` as JSON bytes, whatever values it holds: the journal's :func:`encode` without its
    newline (orjson, or the standard library escaped to ASCII for what orjson refuses: integers
    past 64 bits, lone surrogates), since ``GET /status`` must never fail on a value a client
    sent."""
    return encode(data)[:-1]


def _json(data: Any, status: int = 200) -> Response:
    return Response(json_bytes(data), status_code=status, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message), status_code=status, headers=headers, media_type="application/json")


async def _http_error(request: Request, exc: Exception) -> Response:
    """404, 405 (with ``Allow``) and any other ``HTTPException`` the router raises, as JSON."""
    assert isinstance(exc, HTTPException)
    method, path = request.method, request.url.path
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"no route {method} {path}"
    elif exc.status_code == 405 and headers.get("Allow"):
        # Starlette joins a set, so its order changes between processes; sorted, it reads the same.
        headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
        message = f"{path} takes {headers['Allow']}, not {method}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message, headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware sends this, then re-raises so the server logs the traceback;
    # the client learns only that it was our fault, never our internals.
    return _error(500, f"internal error of the luftpause runtime ({type(exc).__name__}); see its log")


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def status_origins(scheduler_http: str) -> tuple[frozenset[str], str | None]:
    """The browser origins that may read ``/status``: the scheduler's live page, which fetches it
    (``GET /?runtime=...`` on ``[scheduler] http``). Returns ``(exact origins, any-host port)``:

    * the scheduler on a loopback address: ``http://127.0.0.1:P``, ``http://localhost:P`` and
      ``http://[::1]:P`` (the same page under each loopback name);
    * on a named host or address: ``http://<host>:P`` and ``https://<host>:P``;
    * on a wildcard address (``0.0.0.0``, ``::``): the page may be reached under any name of the
      machine, which the runtime cannot know, so any ``http``/``https`` origin on port ``P`` (the
      second item), and the loopback ones.

    No other web page may read it: before, any page could (``*``)."""
    host, port = split_host_port(scheduler_http)
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    if host in WILDCARD_HOSTS or bracketed in WILDCARD_HOSTS:
        return frozenset(f"http://{name}:{port}" for name in LOOPBACK_NAMES), str(port)
    if bracketed in LOOPBACK_NAMES or host == "::1":
        return frozenset(f"http://{name}:{port}" for name in LOOPBACK_NAMES), None
    return frozenset({f"http://{bracketed}:{port}", f"https://{bracketed}:{port}"}), None


class StatusCors:
    """ASGI middleware for ``GET /status``, which the scheduler's live page (another origin)
    fetches from the browser.

    * CORS: a request whose ``Origin`` is one of :func:`status_origins` gets
      ``Access-Control-Allow-Origin: <that origin>`` (and ``Vary: Origin``) on every answer, a 401
      too (so the page can say the token was refused); one without ``Origin`` (curl, a test: not
      a browser's cross-origin read) gets ``*``; the preflight an ``Authorization`` header
      causes (``OPTIONS /status``) is answered 204 here, before the token gate, which would refuse
      it. Any other origin gets no CORS header (the browser withholds the answer) and its
      preflight a 403. No other path is opened to other origins (``/mcp`` must not be).
    * Host: when the runtime listens on a loopback address, a ``Host`` that is not a loopback name
      is refused 421 (DNS rebinding), on ``/mcp`` too, before the SDK's transport security
      would refuse it with a plain-text body: the refusal has the JSON error body.
    """

    def __init__(self, app: ASGIApp, scheduler_http: str, listen_host: str) -> None:
        self.app = app
        self.origins, self.any_host_port = status_origins(scheduler_http)
        self.listen_host = listen_host

    def origin_allowed(self, origin: str) -> bool:
        if origin in self.origins:
            return True
        if self.any_host_port is None:
            return False
        scheme, _, rest = origin.partition("://")
        return (
            scheme in ("http", "https") and "/" not in rest and rest.rsplit(":", 1)[-1] == self.any_host_port
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ("/status", "/mcp"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not host_allowed(headers.get("host"), self.listen_host):
            body = error_body(f"Host {headers.get('host')!r} is not served here")
            await send({"type": "http.response.start", "status": 421, "headers": _json_headers(body)})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["path"] == "/mcp":  # the same Host check as the SDK's, answered in the JSON shape
            await self.app(scope, receive, send)
            return
        origin = headers.get("origin")
        allowed = origin is not None and self.origin_allowed(origin)
        if origin is None:
            # Not a cross-origin read by a browser (which always sends Origin on one): ``*`` gives
            # a web page nothing, and ``Vary: Origin`` keeps a cache from serving it to one.
            cors = [(b"access-control-allow-origin", b"*"), (b"vary", b"origin")]
        elif allowed:
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"origin")]
        else:
            cors = [(b"vary", b"origin")]
        if scope["method"] == "OPTIONS":
            if not allowed or origin is None:
                body = error_body(f"origin {origin!r} may not read /status")
                await send({"type": "http.response.start", "status": 403, "headers": _json_headers(body)})
                await send({"type": "http.response.body", "body": body})
                return
            preflight = [
                *cors,
                (b"access-control-allow-methods", b"GET"),
                (b"access-control-allow-headers", b"authorization"),
                (b"access-control-max-age", b"600"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_origin(message: Message) -> None:
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_origin)


def _json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


def _mcp_routes(mcp_app: Starlette) -> list[BaseRoute]:
    """The SDK app's routes (``/mcp``), to be served by our router rather than a catch-all mount, so
    that unknown paths reach our JSON 404. Without SDK auth its app has no middleware of its own;
    should a later SDK add some, taking only its routes would silently drop it, so refuse."""
    if mcp_app.user_middleware:
        raise RuntimeError("the SDK's MCP app carries middleware; serve it whole instead of its routes")
    return list(mcp_app.routes)


def create_app(config: Config, token: str | None = None) -> Starlette:
    """The runtime's ASGI app for ``config``: ``/mcp``, ``GET /status``, ``GET /health``; its
    :class:`Runtime` is ``app.state.runtime``.

    ``token`` is the shared ``LUFTPAUSE_TOKEN`` (default: read from the environment); with one,
    every path but ``/health`` requires it and turns sent to the dataplane carry it.
    """
    token = (token if token is not None else token_from_env()) or None
    runtime = Runtime(config, token)
    mcp = build_mcp_server(runtime)
    host, _ = split_host_port(config.runtime.listen)
    # The SDK turns on DNS-rebinding protection for loopback hosts itself; bound elsewhere, the
    # operator's network decides who may connect (REFERENCES.md, "transport_security").
    mcp_app = mcp.streamable_http_app(host=host)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        exit_with_parent()  # granian's worker: a SIGKILLed main process must not leave it serving
        if token is None:
            log.warning("%s is not set: /mcp and /status accept every request without a token", TOKEN_ENV)
        async with AsyncExitStack() as stack:
            # Spans over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, from the worker that makes
            # them; flushed last, after every run has stopped.
            if tracing.setup(tracing.RUNTIME_SERVICE):
                stack.callback(tracing.shutdown)
            peer = config.runtime.dataplane_tls
            session = await stack.enter_async_context(
                new_http_session(client_context(peer, "runtime.dataplane_tls") if peer else None)
            )
            await stack.enter_async_context(runtime.upstream)
            # The runtime's own turns carry its caller key when it has one ([runtime] dataplane_key_env).
            dataplane_token = config.runtime.dataplane_key() or token
            dataplane = DataplaneClient(config.runtime.dataplane, session, dataplane_token)
            runtime._loop = SubAgentLoop(dataplane, runtime.upstream)
            runtime._loop.approval_gate = runtime.approvals.gate
            runtime._loop.pods = runtime.pods
            runtime.pods.start_loop = lambda run: runtime.registry.start(run, runtime.loop.drive(run))
            runtime._decider = Decider(config.runtime.dataplane, session, dataplane_token)

            async def end_interrupted_runs() -> None:
                # Runs after the registry has stopped every run, while the session is still open.
                # The journal resumes every run stopped here on the next start, so none is ended
                # at the dataplane (they keep affinity and headroom); only a registry without a
                # journal would list runs here (see SubAgentLoop.drive, which leaves interrupted
                # runs to this step).
                handles = [run.handle for run in runtime.registry.unresumable_interrupted]
                ended = await dataplane.end_runs(handles)
                if handles:
                    log.info("shutdown: %d of %d stopped runs ended at the dataplane", ended, len(handles))

            # Pushed before the registry is entered, so it is called after the registry is left.
            stack.push_async_callback(end_interrupted_runs)
            await stack.enter_async_context(runtime.registry)
            runtime.pods.after_replay()
            runtime.registry.resume(runtime.loop.drive)
            # Entered after the runs, so left before them: a task open at shutdown stays open.
            await stack.enter_async_context(runtime.tasks)
            await stack.enter_async_context(mcp.session_manager.run())
            logs.announce("runtime", f"luftpause runtime: MCP on {runtime.mcp_url}")
            yield

    async def status(request: Request) -> Response:
        return _json(runtime.status())

    async def health(request: Request) -> Response:
        return _json({"ok": True})

    app = Starlette(
        routes=[
            Route("/status", status, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            *monitor_routes(lambda: runtime.pods, host),
            *_mcp_routes(mcp_app),
        ],
        middleware=[
            Middleware(StatusCors, scheduler_http=config.scheduler.http, listen_host=host),
            Middleware(BearerTokenGate, token=token, jsonrpc_paths=frozenset({"/mcp"})),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    return app


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
        Journal(Path(config.runtime.state_dir)).check_writable()
    except OSError as exc:
        logs.announce(
            "runtime",
            f"luftpause runtime: [runtime] state_dir {config.runtime.state_dir!r}: {exc}",
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
    # The app behind the listener guard (luftpause.listeners: body deadline, requests at once, stop).
    loader = partial(guarded, partial(create_app, config), config.runtime.limits, "runtime")
    server.serve(target_loader=loader, wrap_loader=False)
    return 0
