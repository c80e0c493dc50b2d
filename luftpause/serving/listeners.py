"""What every HTTP listener of luftpause gives a client: slow clients cut off, connections bounded,
and a stop that says what it waited for. The limits are ``[scheduler.limits]``,
``[dataplane.limits]`` and ``[runtime.limits]`` (:class:`~luftpause.config.ListenerLimits`).

On the granian listeners (dataplane, runtime), :func:`granian_options` and :class:`ListenerGuard`:

* **head**: granian's HTTP/1 ``header_read_timeout`` is ``header_timeout_s``; a client that has
  not sent a whole request head by then has its connection closed by hyper (no answer can be
  sent before a request is known). The listeners speak HTTP/1.1 only, where that timeout holds.
* **body**: :class:`ListenerGuard` gives a request with a body ``body_timeout_s`` from its head to
  the body's end (granian has no such timeout: 50 connections that sent one chunk and went
  silent were all still open 40 s later). Past it the request's task is cancelled, the client
  gets 408 with the JSON error body and ``Connection: close``, and the connection is closed
  (granian closes it when the application raises after its answer: :class:`SlowClientCutOff`,
  whose log line granian would write is filtered out, one INFO line of ours instead).
* **connections**: at most ``max_connections`` requests are served at once; one more is answered
  503 with the JSON error body and ``Retry-After: 1`` (its connection closed), and granian accepts
  at most ``max_connections`` + :data:`ACCEPT_MARGIN` connections (its ``backpressure``): the rest
  wait in the kernel's backlog until one closes.
* **stop** (SIGTERM, Ctrl-C): granian's ASGI lifespan shutdown comes at once, while requests are
  still being served, and the guard holds it back until they end (:meth:`ListenerGuard.drain`):
  it logs what is open (requests by method and path, the oldest's age), answers new requests
  503, waits up to ``stop_timeout_s``, then cuts off what is left (a stream is broken, an
  unanswered request gets 503 with the JSON error body) and lets the application shut down; it
  logs each step and the whole stop's duration. Before, the dataplane waited for every stream to
  end (106 s for three long ones). A worker still there ``stop_timeout_s`` + :data:`APP_STOP_S`
  (and the unwinding) after the signal exits at once, saying so. (Not granian's
  ``workers_kill_timeout``: its main process then joins the worker from two threads, loses the
  race to reap it, and logs "Killing worker-1 after it refused to gracefully stop" for a worker
  that had stopped.)

The scheduler's status port is aiohttp, in the scheduler's own loop (:func:`start_aiohttp_site`):
its idle and head timeout is aiohttp's keep-alive timeout (``header_timeout_s``: aiohttp closes a
connection with no complete request after it, partial heads included), requests carry no body
(its routes are GET; aiohttp reads at most ``body_timeout_s`` of a body it does not use), and a
connection past ``max_connections`` is answered 503 with the JSON error body and closed.

What cannot be given: hyper answers a request with more than 100 headers itself, 431 with an
empty body, before the application is called (granian 2.8.9 exposes no setting or hook for it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

import orjson

from luftpause.auth.tls import granian_options as tls_options
from luftpause.config import ListenerLimits, TlsListener

log = logging.getLogger("luftpause.listeners")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ACCEPT_MARGIN = 64
"""Connections granian accepts past ``max_connections``, so that the ones past the bound can still
be answered 503 rather than wait unanswered."""

APP_STOP_S = 5.0
"""Seconds the application's own shutdown (after the open requests are dealt with) may take: a
worker still there ``stop_timeout_s`` + :data:`_UNWIND_S` + this after the signal exits at once
(:meth:`ListenerGuard._watch_stop_signals`)."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

SWEEP_S = 1.0
"""How often the body deadlines are looked at (seconds): a body is cut off at most this late."""


class SlowClientCutOff(Exception):
    """Raised out of the application after its 408 or 503, so that granian closes the connection
    (it does when the application raises after answering; a finished answer alone leaves the
    connection open, waiting for the rest of the body)."""


class _GranianCutOffFilter(logging.Filter):
    """Drops granian's "Application callable raised an exception" record of a
    :class:`SlowClientCutOff`: the guard has logged the cut-off already, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return SlowClientCutOff.__name__ not in record.getMessage()


_CUT_OFF_FILTER = _GranianCutOffFilter()


def granian_options(limits: ListenerLimits, tls: TlsListener | None = None) -> dict[str, Any]:
    """Keyword arguments of ``granian.Granian`` for ``limits`` and ``tls`` (see the module
    docstring)."""
    from granian.constants import HTTPModes
    from granian.http import HTTP1Settings

    return {
        "http": HTTPModes.http1,
        "http1_settings": HTTP1Settings(header_read_timeout=round(limits.header_timeout_s * 1000)),
        "backpressure": limits.max_connections + ACCEPT_MARGIN,
        "backlog": max(128, limits.max_connections),
        **tls_options(tls),
    }


def json_error(
    status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> tuple[Message, Message]:
    """The two ASGI messages of an error answer with the JSON error body and ``Connection: close``."""
    body = orjson.dumps({"error": {"message": message}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(extra or []),
    ]
    return (
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": body, "more_body": False},
    )


def _expects_body(scope: Scope) -> bool:
    if scope["method"] in _BODY_METHODS:
        return True
    return any(name in (b"content-length", b"transfer-encoding") for name, _ in scope["headers"])


class _Request:
    """One request being served: what the stop report shows, its task, and why the guard cut it
    off (``cut``: ``"body"`` when its body missed the deadline, ``"stop"`` when a stop did)."""

    __slots__ = ("_receive", "at", "cut", "deadline", "method", "path", "received", "task")

    def __init__(self, scope: Scope, receive: Receive, at: float) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.at = at
        self._receive = receive
        self.received = 0
        self.cut: str | None = None
        self.deadline = 0.0
        """Loop time by which the body must be complete; 0: no body is awaited (any more)."""
        task = asyncio.current_task()
        assert task is not None
        self.task = task

    def cut_off(self, why: str) -> None:
        """Cancel the request's task (the guard answers it when the task unwinds)."""
        if self.cut is None:
            self.cut = why
            self.deadline = 0.0
            self.task.cancel()

    def receive(self) -> Awaitable[Message]:
        """The application's ``receive``: as granian's once the body is complete, watched before."""
        if not self.deadline:
            return self._receive()
        return self._receive_body()

    async def _receive_body(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            self.deadline = 0.0
        else:
            self.received += len(message.get("body", b""))
        return message


class ListenerGuard:
    """ASGI middleware around a granian-served application: the body deadline, the bound on
    requests at once, and the stop (see the module docstring). ``name`` is the process
    (``dataplane``, ``runtime``) in log lines and answers."""

    def __init__(self, app: ASGIApp, limits: ListenerLimits, name: str) -> None:
        self.app = app
        self.limits = limits
        self.name = name
        self.open: dict[int, _Request] = {}
        """id(scope) -> every request being served."""
        self.stopping = False
        self._sweeper: asyncio.Task[None] | None = None
        self._drained: asyncio.Event | None = None
        """Set when the last open request ends during a stop."""
        logging.getLogger("_granian.utils").addFilter(_CUT_OFF_FILTER)  # granian logs it there

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), self._lifespan_send(send))
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        open_ = self.open
        if len(open_) >= self.limits.max_connections or self.stopping:
            if self.stopping:
                message = f"the {self.name} is stopping"
            else:
                message = (
                    f"the {self.name} serves {self.limits.max_connections} requests at once "
                    "(limits.max_connections); retry"
                )
            await _answer(send, 503, message, [(b"retry-after", b"1")])
            raise SlowClientCutOff(f"503: {message}")
        key = id(scope)
        loop = asyncio.get_running_loop()
        request = open_[key] = _Request(scope, receive, loop.time())
        if _expects_body(scope):
            request.deadline = request.at + self.limits.body_timeout_s
            receive = request.receive
            if self._sweeper is None:
                self._sweeper = loop.create_task(self._sweep(), name="listener-body-deadlines")
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if request.cut is None:
                raise  # not ours: the client left, or the worker is stopping
            request.task.uncancel()
        finally:
            del open_[key]
            if not open_ and self._drained is not None:
                self._drained.set()
        if request.cut is not None:
            await self._cut_off(scope, send, request)

    async def _sweep(self) -> None:
        """Cut off every request whose body missed its deadline, looking every :data:`SWEEP_S` (at
        most a quarter of ``body_timeout_s``): one task for all, rather than a timer armed and
        cancelled per request on the hot path."""
        loop = asyncio.get_running_loop()
        every = min(SWEEP_S, self.limits.body_timeout_s / 4)
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for request in [r for r in self.open.values() if r.deadline and now >= r.deadline]:
                request.cut_off("body")

    async def _cut_off(self, scope: Scope, send: Send, request: _Request) -> None:
        """Answer a request the guard cut off, if its answer has not begun, and raise
        :class:`SlowClientCutOff` so that granian closes its connection."""
        if request.cut == "body":
            client = scope.get("client") or ("?", 0)
            log.info(
                "%s: 408 to %s:%s: %s %s sent %d bytes of its body in %g s (limits.body_timeout_s)",
                self.name,
                client[0],
                client[1],
                request.method,
                request.path,
                request.received,
                self.limits.body_timeout_s,
            )
            status, message = (
                408,
                f"the request body was not complete {self.limits.body_timeout_s:g} s after its "
                f"headers ({request.received} bytes came); send the whole body at once",
            )
        else:
            status, message = 503, f"the {self.name} stopped before this request was answered"
        await _answer(send, status, message)
        raise SlowClientCutOff(f"{status}: {message}")

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def lifespan_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._watch_stop_signals()
            elif message["type"] == "lifespan.shutdown":
                if self._draining is None:
                    self._draining = asyncio.ensure_future(self.drain())
                await self._draining
            return message

        return lifespan_receive

    _draining: asyncio.Future[None] | None = None

    def _watch_stop_signals(self) -> None:
        """Begin the drain at SIGTERM or SIGINT, in the worker.

        granian's worker hears these signals through its event loop (uvloop's
        ``add_signal_handler``, woken by the signal wakeup fd), stops accepting, and then waits
        for every open connection to end before its lifespan shutdown ever comes: the guard
        would learn of the stop only once there is nothing left to cut off. So it sets a
        Python-level handler as well, which Python runs beside the loop's (the wakeup fd is
        written either way), calling the one it replaces."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)

            def handler(received: int, frame: Any, previous: Any = previous) -> None:
                if callable(previous):
                    previous(received, frame)
                loop.call_soon_threadsafe(self._begin_drain)

            signal.signal(signum, handler)

    def _begin_drain(self) -> None:
        if self._draining is not None:
            return
        self._draining = asyncio.ensure_future(self.drain())
        bound = self.limits.stop_timeout_s + _UNWIND_S + APP_STOP_S

        def exit_late() -> None:
            time.sleep(bound)
            log.error("%s: the stop took more than %g s: exiting now", self.name, bound)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(1)

        threading.Thread(target=exit_late, name="stop-bound", daemon=True).start()

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                log.info("%s: stopped in %.2f s", self.name, time.monotonic() - self._stop_began)
                if self._sweeper is not None:
                    self._sweeper.cancel()
            await send(message)

        return lifespan_send

    _stop_began = 0.0

    async def drain(self) -> None:
        """The stop, before the application's own shutdown: new requests are answered 503; the
        open ones get ``limits.stop_timeout_s`` to end, and the rest are cut off (and given a
        moment to unwind). Every step is logged with what it waits for."""
        self.stopping = True
        self._stop_began = time.monotonic()
        grace = self.limits.stop_timeout_s
        if not self.open:
            log.info("%s: stopping; no request open", self.name)
            return
        log.info("%s: stopping; %s; waiting up to %g s for them", self.name, self.describe_open(), grace)
        self._drained = asyncio.Event()
        if await self._wait_drained(grace):
            log.info("%s: every request ended in %.2f s", self.name, time.monotonic() - self._stop_began)
            return
        log.warning(
            "%s: cutting off what is still open after %g s: %s", self.name, grace, self.describe_open()
        )
        for request in list(self.open.values()):
            request.cut_off("stop")
        if not await self._wait_drained(_UNWIND_S):
            log.warning("%s: %s did not unwind; stopping anyway", self.name, self.describe_open())

    async def _wait_drained(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for every open request to end; whether they did."""
        assert self._drained is not None
        if not self.open:
            return True
        try:
            await asyncio.wait_for(self._drained.wait(), seconds)
        except TimeoutError:
            return not self.open
        return True

    def describe_open(self) -> str:
        """What is being served, for a log line: ``no request open`` or ``3 requests open: 2 POST
        /v1/chat/completions, 1 GET /mcp (the oldest for 12.3 s)``."""
        if not self.open:
            return "no request open"
        counts = Counter(f"{r.method} {r.path}" for r in self.open.values())
        oldest = asyncio.get_running_loop().time() - min(r.at for r in self.open.values())
        listed = ", ".join(f"{count} {what}" for what, count in counts.most_common())
        plural = "s" if len(self.open) != 1 else ""
        return f"{len(self.open)} request{plural} open: {listed} (the oldest for {oldest:.1f} s)"


_UNWIND_S = 2.0
"""Seconds the requests cut off at a stop get to unwind (close their engine requests, report)."""


async def _answer(
    send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send an error answer, unless the application's answer has begun (granian then refuses a
    second start with ``RuntimeError``: nothing more can be said, the connection is closed)."""
    start, body = json_error(status, message, extra)
    try:
        await send(start)
    except RuntimeError:
        return
    await send(body)


def guarded(factory: Callable[[], ASGIApp], limits: ListenerLimits, name: str) -> ListenerGuard:
    """``factory()`` behind a :class:`ListenerGuard`: a granian ``target_loader`` (picklable when
    ``factory`` is, e.g. a ``functools.partial`` of a module-level function)."""
    return ListenerGuard(factory(), limits, name)


# --- the scheduler's aiohttp listener ----------------------------------------------------------


async def start_aiohttp_site(
    runner: Any, host: str, port: int, limits: ListenerLimits, ssl_context: Any = None
) -> asyncio.AbstractServer:
    """Serve ``runner``'s application (a set-up ``aiohttp.web.AppRunner``) on ``host:port`` with
    ``limits`` (see the module docstring) and, with ``ssl_context``, TLS. Returns the listening
    server; close it, then ``runner.cleanup()``. Raises ``OSError`` when the port is taken."""
    from aiohttp import web_protocol
    from aiohttp.http_exceptions import HttpProcessingError

    loop = asyncio.get_running_loop()
    server = runner.server

    class JsonErrorsHandler(web_protocol.RequestHandler):
        """aiohttp's protocol, its own error answers (a malformed request, too many or too long
        headers) in the JSON error shape rather than text."""

        def handle_error(
            self,
            request: Any,
            status: int = 500,
            exc: BaseException | None = None,
            message: str | None = None,
        ) -> Any:
            from aiohttp import web

            if request.writer.output_size > 0:
                return super().handle_error(request, status, exc, message)
            if isinstance(exc, HttpProcessingError) and exc.message and status < 500:
                text = exc.message
                if text.startswith("Too many headers"):
                    status = 431  # what it is (RFC 6585 section 5); aiohttp says 400
            elif exc is not None and status < 500:
                text = str(exc)
            else:
                text = message or "internal error"
            response = web.Response(
                status=status,
                body=orjson.dumps({"error": {"message": text or f"HTTP {status}"}}),
                content_type="application/json",
            )
            response.force_close()
            return response

    class Refuse503(asyncio.Protocol):
        """A connection past ``max_connections``: its request head read (at most 8 KiB, within
        ``header_timeout_s``), answered 503 with the JSON error body, and closed."""

        def __init__(self) -> None:
            self.head = b""
            self.transport: asyncio.Transport | None = None
            self.timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's is not asyncio's class
            self.timer = loop.call_later(limits.header_timeout_s, self.transport.close)

        def data_received(self, data: bytes) -> None:
            self.head += data
            if b"\r\n\r\n" not in self.head and len(self.head) < 8192:
                return
            assert self.transport is not None
            if self.timer is not None:
                self.timer.cancel()
            body = orjson.dumps(
                {
                    "error": {
                        "message": f"the scheduler serves {limits.max_connections} connections at once; retry"
                    }
                }
            )
            head = (
                f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
            ).encode()
            self.transport.write(head + body)
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.timer is not None:
                self.timer.cancel()

    def protocol() -> asyncio.Protocol:
        if len(server.connections) >= limits.max_connections:
            return Refuse503()
        handler: asyncio.Protocol = JsonErrorsHandler(
            server,
            loop=loop,
            keepalive_timeout=limits.header_timeout_s,
            lingering_time=min(limits.body_timeout_s, 10.0),
            access_log=None,  # type: ignore[arg-type]  # aiohttp takes None (no access log), as AppRunner passes it
        )
        return handler

    return await loop.create_server(
        protocol, host, port, ssl=ssl_context, backlog=max(128, limits.max_connections), reuse_address=True
    )


def aiohttp_deadline(limits: ListenerLimits) -> Any:
    """aiohttp middleware: a request with a body (the scheduler's admin API takes one) not answered
    ``body_timeout_s`` after it came is answered 408 with the JSON error body, its connection
    closed: aiohttp itself never times out a body its handler waits for."""
    from aiohttp import web

    @web.middleware
    async def deadline(request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.can_read_body:
            response: web.StreamResponse = await handler(request)
            return response
        timeout = asyncio.timeout(limits.body_timeout_s)
        try:
            async with timeout:
                response = await handler(request)
                return response
        except TimeoutError:
            if not timeout.expired():
                raise
            log.info(
                "scheduler: 408 to %s: %s %s not answered %g s after it came (limits.body_timeout_s)",
                request.remote,
                request.method,
                request.path,
                limits.body_timeout_s,
            )
            message = f"the request body was not complete {limits.body_timeout_s:g} s after its headers"
            refused = web.Response(
                status=408,
                body=orjson.dumps({"error": {"message": message}}),
                content_type="application/json",
            )
            refused.force_close()
            return refused

    return deadline
