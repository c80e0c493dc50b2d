"""The dataplane's ASGI application (served by granian on uvloop; why ASGI: ``asgi.py``): its
route table (:attr:`Dataplane.routes`, one :class:`Route` per path, each to one handler), its
lifespan, and the error contract for whatever a handler raises. Built by
:func:`luftpause.dataplane.wiring.build_dataplane`, which hands it every part it uses.

Routes (docs/architecture.md "The proxy"):

=============================  ==================================================================
``POST /v1/chat/completions``  OpenAI Chat Completions, streamed or not, admitted by the scheduler
``POST /v1/messages``          Anthropic Messages (``?beta=true`` too), streamed or not; admitted
                               alike, relayed natively or translated (``front_doors``)
``POST /v1/responses``         OpenAI Responses, streamed or not; the same
``POST /v1/messages/           ``{"input_tokens": N}``, the engine's count (``token_count``); not a
count_tokens``                 turn: neither admitted nor scheduled
``POST /v1/decide``            a single-pass turn in vLLM's ``/classify`` shape (``{"model": str,
                               "input": str | [str, ...]}``), forwarded to a single-pass replica's
                               ``/classify`` and its answer relayed unchanged
``GET /v1/models``             the union of the models the configured replicas serve (both kinds),
                               in Anthropic's page shape when the request has ``anthropic-version``
                               (``GET /v1/models/{id}``: one of them)
``DELETE /v1/runs/{id}``       the run ended: the scheduler forgets it at once (204)
``GET /health``                ``{"status": "ok", "scheduler": "connected" | "connecting", "runs": int,
                               "in_flight": int, "held": int, "leases": {replica: unused leased
                               slots}, "leased_turns_total": int}`` (runs: in the run table;
                               in_flight: turns at an engine now; held: turns waiting for the
                               scheduler now; leased_turns_total: a counter, the turns placed
                               under a lease since start, with no round trip to the scheduler;
                               it was ``leased_turns``, which read as turns leased now: 12 on an
                               idle pool)
``GET /metrics``               Prometheus text (``luftpause.dataplane.observe.metrics``), no token needed
``GET /status``                ``{"usage": usage}``: tokens per caller and model over the process's
                               life and per window (:meth:`luftpause.dataplane.observe.usage.Usage.report`);
                               with ``LUFTPAUSE_TOKEN`` set, only with it (``Authorization: Bearer``)
``GET /admin/usage``           the same ``usage`` alone, for billing and budget scripts (the same token)
``GET /livez``, ``GET /readyz``  liveness and readiness (:mod:`luftpause.serving.health`), no token needed:
                               ready while the scheduler link is resynced and the scheduler counts
                               a replica healthy
=============================  ==================================================================

Request headers read: ``x-luftpause-run-id`` (else the run that emitted a ``tool_call`` id the
messages answer, remembered 30 min; else a new run), ``x-luftpause-class``
(``interactive`` | ``batch``), ``x-luftpause-caller`` (truncated to 128 bytes), ``traceparent``
with its ``tracestate`` (both sent on to the engine).
With ``LUFTPAUSE_TOKEN`` set every ``/v1`` route needs ``Authorization: Bearer <token>``, or the
token as ``x-api-key`` (what the Anthropic clients send); with caller keys, a configured key
instead (sent either way), which also decides the turn's caller and the service classes it may
use (:mod:`luftpause.auth.callers`; 403 for another class): what a request becomes before it is
admitted is ``intake.turns``. Errors on the Messages and Responses routes take their API's shape
(``front_doors.error_body``).

Every answer to a chat turn carries ``x-luftpause-run-id`` (the client's, or the new run's); an
answer to a request refused before it became a turn (401, 413, 415, malformed body or headers) carries
the client's own when it sent one. Answers from ``/v1/decide`` never carry it: a single-pass turn
belongs to no run, and its ``x-luftpause-run-id`` request header is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from luftpause.auth.callers import Access
from luftpause.auth.tokens import bearer_matches
from luftpause.dataplane.apis.errors import Api
from luftpause.dataplane.apis.models import model_body, wants_anthropic
from luftpause.dataplane.asgi import (
    BodyCutShort,
    ClientGone,
    Exchange,
    Headers,
    Receive,
    Scope,
    Send,
    StreamBroken,
)
from luftpause.dataplane.errors import (
    BadRequest,
    DataplaneError,
    MethodNotAllowed,
    NotFound,
    TooManyRequests,
    Unauthorized,
)
from luftpause.dataplane.intake.checks import (
    RUN_ID_MAX_BYTES,
    acceptable_run_id,
    allow,
    client_run_id,
    json_with_model,
    read_body,
)
from luftpause.dataplane.intake.front_doors import COUNT_TOKENS_PATH, MESSAGES_PATH, RESPONSES_PATH, api_of
from luftpause.dataplane.intake.front_doors import error_body as api_error_body
from luftpause.dataplane.intake.turns import TurnIntake
from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.link.placement import Placement
from luftpause.dataplane.link.replicas import Replicas
from luftpause.dataplane.observe.answer_metrics import CLIENT_LEFT
from luftpause.dataplane.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from luftpause.dataplane.observe.metrics import DataplaneMetrics, Gauges
from luftpause.dataplane.relay.loop import Relay
from luftpause.dataplane.relay.upstream import Upstream
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.server.token_count import count_tokens
from luftpause.dataplane.server.turns import TurnRunner
from luftpause.dataplane.turn import RUN_ID_HEADER
from luftpause.observe import tracing
from luftpause.serving import health as probes
from luftpause.supervise.orphans import exit_with_parent
from luftpause.tool_calls import ToolCallTable
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["DECIDE_PATH", "MAX_ENDED_RUNS", "TURN_PATHS", "Dataplane", "Route"]

log = logging.getLogger("luftpause.dataplane")

MAX_ENDED_RUNS = 100_000
"""Runs ended by ``DELETE /v1/runs/{id}`` remembered (for the tool-call ids' ttl), oldest first out."""
DECIDE_PATH = "/v1/decide"
TURN_PATHS = frozenset({"/v1/chat/completions", MESSAGES_PATH, RESPONSES_PATH, DECIDE_PATH})
"""The routes whose answers ``luftpause_dataplane_turn_responses_total`` counts by status."""

_JSON: Headers = [(b"content-type", b"application/json")]
_RUN_ID = RUN_ID_HEADER.encode()
_METRICS_HEAD: Headers = [(b"content-type", METRICS_CONTENT_TYPE.encode())]
_ANTHROPIC_VERSION = b"anthropic-version"
_READ = ("GET", "HEAD")

Handler = Callable[[Exchange], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the route table: ``path`` (a trailing ``{name}`` matches one non-empty rest of
    the path), the ``methods`` it answers (405 with ``Allow`` for another), its ``handler``. Every
    ``/v1`` route needs the token or a caller key (401, before its path is even matched)."""

    path: str
    methods: tuple[str, ...]
    handler: Handler

    @property
    def prefix(self) -> str | None:
        """For a path ending in ``{name}``: what comes before it; else ``None``."""
        head, brace, _ = self.path.partition("{")
        return head if brace else None


class Dataplane:
    """ASGI application (``__call__``); granian's worker runs its lifespan (startup, shutdown).

    Every part is given when it is built (:func:`luftpause.dataplane.wiring.build_dataplane`):
    ``runs``, ``tool_calls`` and ``ended_runs`` (run id -> the ``clock()`` time its ``DELETE``
    came, oldest first) are the tables run identity reads, pruned every ``prune_every_s`` seconds;
    ``access`` who may use the ``/v1`` routes; ``intake`` what a request becomes; ``replicas`` the
    replicas as the scheduler last said; ``link``, ``placement``, ``relay`` and ``turns`` what a
    turn goes through; ``upstream`` the engine connections; ``metrics`` what ``/metrics`` serves.
    """

    def __init__(
        self,
        *,
        runs: RunTable,
        tool_calls: ToolCallTable,
        ended_runs: dict[str, float],
        access: Access,
        intake: TurnIntake,
        replicas: Replicas,
        link: SchedulerLink,
        placement: Placement,
        upstream: Upstream,
        relay: Relay,
        turns: TurnRunner,
        metrics: DataplaneMetrics,
        clock: Callable[[], float],
        prune_every_s: float,
    ) -> None:
        self.runs = runs
        self.tool_calls = tool_calls
        self.ended_runs = ended_runs
        """Run id -> ``clock()`` its ``DELETE`` came, oldest first: a tool-call id it emitted no
        longer resolves to it. A set beside the table rather than a run -> ids index, which would
        cost on every remembered id: at most ``MAX_ENDED_RUNS`` entries, measured 151 bytes each
        for 40-byte ids (15 MB when full), 367 bytes at the 256-byte limit (37 MB)."""
        self.access = access
        self.intake = intake
        self.replicas = replicas
        self.link = link
        self.placement = placement
        self.upstream = upstream
        self.relay = relay
        self.turns = turns
        self.metrics = metrics
        self._clock = clock
        self._prune_every_s = prune_every_s
        self._prune_task: asyncio.Task[None] | None = None
        self.routes: tuple[Route, ...] = (
            Route("/v1/chat/completions", ("POST",), self._chat_completions),
            Route(MESSAGES_PATH, ("POST",), self._messages),
            Route(RESPONSES_PATH, ("POST",), self._responses),
            Route(DECIDE_PATH, ("POST",), self._decide),
            Route(COUNT_TOKENS_PATH, ("POST",), self._count_tokens),
            Route("/v1/models", _READ, self._models),
            Route("/v1/models/{id}", _READ, self._model),
            Route("/v1/runs/{id}", ("DELETE",), self._end_run),
            Route("/health", _READ, self._health),
            Route("/metrics", _READ, self._metrics),
            Route("/status", _READ, self._status),
            Route("/admin/usage", _READ, self._usage),
            Route("/livez", _READ, self._livez),
            Route("/readyz", _READ, self._readyz),
        )
        """The route table: every path the dataplane answers, each to one handler."""
        self._exact = {route.path: route for route in self.routes if route.prefix is None}
        self._prefixed = [(route.prefix, route) for route in self.routes if route.prefix is not None]

    # --- lifecycle -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point: ``http`` requests and the ``lifespan`` protocol."""
        kind = scope["type"]
        if kind == "http":
            await self._http(Exchange(scope, receive, send))
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """ASGI lifespan: granian's worker sends startup before serving and shutdown after."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("dataplane startup failed")
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                tracing.shutdown()  # export the spans still buffered (a no-op when tracing is off)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        """Start what runs in the background: the engine connections' sweep, the pruning of the
        run tables and the scheduler link."""
        # In granian's worker: a worker whose main process was SIGKILLed would go on serving (and
        # stay connected to the scheduler) with nobody to stop it.
        exit_with_parent()
        self.upstream.start()
        self._prune_task = asyncio.get_running_loop().create_task(self._prune_forever())
        await self.link.start()

    async def _prune_forever(self) -> None:
        """Every ``prune_every_s`` seconds: forget idle runs, expired tool-call ids and ended runs
        older than the tool-call ids' ttl (no id of theirs can be looked up any more)."""
        while True:
            await asyncio.sleep(self._prune_every_s)
            now = self._clock()
            self.runs.prune(now)
            self.tool_calls.prune(now)
            ended, horizon = self.ended_runs, now - self.tool_calls.ttl_s
            while ended and next(iter(ended.values())) < horizon:
                del ended[next(iter(ended))]

    async def shutdown(self) -> None:
        if self._prune_task is not None:
            self._prune_task.cancel()
            try:
                await self._prune_task
            except asyncio.CancelledError:
                pass
        await self.link.close()
        await self.upstream.close()

    # --- routing ---------------------------------------------------------------------------------

    async def _http(self, exchange: Exchange) -> None:
        try:
            await self._answer(exchange)
        finally:
            if exchange.path in TURN_PATHS:
                self.metrics.answers.responded(exchange.status or CLIENT_LEFT)

    def _route(self, exchange: Exchange) -> Route:
        """The route of ``exchange``'s path (its method allowed); for a ``/v1`` path only once the
        request's credential is taken. :class:`NotFound`, :class:`MethodNotAllowed` otherwise."""
        path, method = exchange.path, exchange.method
        if path.startswith("/v1/"):
            self.intake.authorize(exchange)
        route = self._exact.get(path)
        if route is None:
            route = next((r for head, r in self._prefixed if path.startswith(head) and path != head), None)
        if route is None:
            raise NotFound(f"no route {method} {path}")
        allow(path, method, *route.methods)
        return route

    async def _answer(self, exchange: Exchange) -> None:
        """Route the request; answer an error of its with the JSON error body."""
        try:
            await self._route(exchange).handler(exchange)
        except DataplaneError as exc:
            if exchange.started:
                raise StreamBroken(str(exc)) from None  # cannot happen by design; never a clean end
            if isinstance(exc, BodyCutShort):
                log.info("%s %s: %s", exchange.method, exchange.path, exc)
            if exc.run_id is None and exchange.path != DECIDE_PATH:
                exc.run_id = client_run_id(exchange)
            headers = _JSON if exc.run_id is None else [*_JSON, (_RUN_ID, exc.run_id.encode())]
            if isinstance(exc, MethodNotAllowed):
                headers = [*headers, (b"allow", exc.allow.encode())]
            elif isinstance(exc, Unauthorized):
                headers = [*headers, (b"www-authenticate", exc.challenge.encode())]
            elif isinstance(exc, TooManyRequests):
                headers = [*headers, (b"retry-after", str(exc.retry_after_s).encode())]
            api = api_of(exchange.path, exchange.headers.get(_ANTHROPIC_VERSION))
            await exchange.respond(
                exc.status, headers, exc.body() if api is None else api_error_body(api, exc)
            )
        except ClientGone:
            pass
        except StreamBroken:
            raise  # granian aborts the connection: the client sees its stream broken
        except Exception as exc:
            # A fault of ours still answers with the error contract if nothing was sent yet, and
            # breaks the connection if something was.
            log.exception("%s %s failed", exchange.method, exchange.path)
            if exchange.started:
                raise StreamBroken(f"internal error: {type(exc).__name__}") from None
            error = DataplaneError(f"internal error: {type(exc).__name__}")
            api = api_of(exchange.path, exchange.headers.get(_ANTHROPIC_VERSION))
            await exchange.respond(500, _JSON, error.body() if api is None else api_error_body(api, error))

    def _authorize_operator(self, exchange: Exchange) -> None:
        """:class:`Unauthorized` unless the request carries ``LUFTPAUSE_TOKEN`` (when it is set):
        the usage of every caller is the operator's to read, not a caller key's."""
        token = self.access.token
        if token is not None and not bearer_matches(exchange.headers.get(b"authorization"), token):
            raise Unauthorized("missing or wrong bearer token (Authorization: Bearer <LUFTPAUSE_TOKEN>)")

    def readiness(self) -> dict[str, probes.Check]:
        """``/readyz``'s checks: ``scheduler``, the link is resynced; ``replicas``, the scheduler
        counts one healthy (as its last answer said; a scheduler that does not say passes)."""
        link = self.link
        healthy = link.healthy_replicas
        if healthy is None:
            replicas = probes.Check(True, "the scheduler has not said how many replicas are healthy")
        else:
            replicas = probes.Check(healthy > 0, f"{healthy} healthy, as the scheduler last said")
        return {
            "scheduler": probes.Check(
                link.connected, f"{'connected to' if link.connected else 'connecting to'} {link.target}"
            ),
            "replicas": replicas,
        }

    # --- the routes' handlers --------------------------------------------------------------------

    async def _chat_completions(self, exchange: Exchange) -> None:
        await self.turns.run(self.intake.chat_turn(exchange, await read_body(exchange)), exchange)

    async def _messages(self, exchange: Exchange) -> None:
        await self._front_door(exchange, "messages")

    async def _responses(self, exchange: Exchange) -> None:
        await self._front_door(exchange, "responses")

    async def _front_door(self, exchange: Exchange, api: Api) -> None:
        """``POST /v1/messages`` or ``POST /v1/responses``: planned (``front_doors``), then
        admitted and relayed as a chat turn is."""
        body = await read_body(exchange)
        turn = self.intake.front_door_turn(exchange, api, body, self.replicas.front_doors)
        await self.turns.run(turn, exchange)

    async def _decide(self, exchange: Exchange) -> None:
        await self.turns.run(self.intake.single_pass_turn(exchange, await read_body(exchange)), exchange)

    async def _count_tokens(self, exchange: Exchange) -> None:
        raw = await read_body(exchange)
        payload, model = json_with_model(raw)
        replica, plan = self.replicas.front_doors.count_plan(payload, raw, model)
        await exchange.respond(200, _JSON, await count_tokens(self.relay.pool_of(replica), plan))

    async def _models(self, exchange: Exchange) -> None:
        anthropic = wants_anthropic(exchange.header(_ANTHROPIC_VERSION))
        replicas = self.replicas
        body = replicas.anthropic_models_body if anthropic else replicas.models_body
        await exchange.respond(200, _JSON, body)

    async def _model(self, exchange: Exchange) -> None:
        model = exchange.path[len("/v1/models/") :]
        found = model_body(self.replicas.models, model, wants_anthropic(exchange.header(_ANTHROPIC_VERSION)))
        if found is None:
            raise NotFound(f"no replica serves model {model!r}")
        await exchange.respond(200, _JSON, found)

    async def _end_run(self, exchange: Exchange) -> None:
        """``DELETE /v1/runs/{id}``: the run ended; the scheduler forgets it at once."""
        run_id = exchange.path[len("/v1/runs/") :]
        if not acceptable_run_id(run_id):
            raise BadRequest(f"a run id is at most {RUN_ID_MAX_BYTES} bytes")
        self.runs.forget(run_id)
        ended = self.ended_runs
        ended.pop(run_id, None)
        ended[run_id] = self._clock()
        if len(ended) > MAX_ENDED_RUNS:
            del ended[next(iter(ended))]
        self.link.report(pb.TurnEvent(run_id=run_id, kind=pb.TurnEvent.RUN_ENDED))
        await exchange.respond(204, [(_RUN_ID, run_id.encode())])

    async def _health(self, exchange: Exchange) -> None:
        health = {
            "status": "ok",
            "scheduler": "connected" if self.link.connected else "connecting",
            "runs": len(self.runs.runs),
            "in_flight": self.relay.in_flight(),
            "held": self.placement.held,
            "leases": self.link.leases(),
            "leased_turns_total": self.link.leased_turns,
        }
        await exchange.respond(200, _JSON, orjson.dumps(health))

    async def _metrics(self, exchange: Exchange) -> None:
        gauges = Gauges(
            self.relay.in_flight(), self.placement.held, self.link.connected, self.link.healthy_replicas
        )
        await exchange.respond(200, _METRICS_HEAD, self.metrics.exposition(gauges))

    async def _status(self, exchange: Exchange) -> None:
        self._authorize_operator(exchange)
        await exchange.respond(200, _JSON, orjson.dumps({"usage": self.metrics.answers.usage.report()}))

    async def _usage(self, exchange: Exchange) -> None:
        self._authorize_operator(exchange)
        await exchange.respond(200, _JSON, orjson.dumps(self.metrics.answers.usage.report()))

    async def _livez(self, exchange: Exchange) -> None:
        status, body = probes.LIVE
        await exchange.respond(status, _JSON, body)

    async def _readyz(self, exchange: Exchange) -> None:
        status, body = probes.report(self.readiness())
        await exchange.respond(status, _JSON, body)
