"""The dataplane's ASGI application (served by granian on uvloop; why ASGI: ``asgi.py``).

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
``GET /metrics``               Prometheus text (``luftpause.dataplane.server.metrics``), no token needed
``GET /status``                ``{"usage": usage}``: tokens per caller and model over the process's
                               life and per window (:meth:`luftpause.dataplane.server.usage.Usage.report`);
                               with ``LUFTPAUSE_TOKEN`` set, only with it (``Authorization: Bearer``)
``GET /admin/usage``           the same ``usage`` alone, for billing and budget scripts (the same token)
``GET /livez``, ``GET /readyz``  liveness and readiness (:mod:`luftpause.health`), no token needed:
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
admitted is ``turn_intake``. Errors on the Messages and Responses routes take their API's shape
(``front_doors.error_body``).

Every answer to a chat turn carries ``x-luftpause-run-id`` (the client's, or the new run's); an
answer to a request refused before it became a turn (401, 413, 415, malformed body or headers) carries
the client's own when it sent one. Answers from ``/v1/decide`` never carry it: a single-pass turn
belongs to no run, and its ``x-luftpause-run-id`` request header is ignored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import grpc.aio
import orjson
from pydantic import ValidationError

from luftpause import health as probes
from luftpause import tracing
from luftpause.auth.callers import Access
from luftpause.auth.grpc_link import LinkCredentials
from luftpause.auth.tokens import bearer_matches
from luftpause.config import Config, ReplicaConfig, load_config, split_host_port
from luftpause.dataplane.apis.errors import Api
from luftpause.dataplane.apis.models import model_body, models_body, wants_anthropic
from luftpause.dataplane.errors import (
    BadRequest,
    DataplaneError,
    EngineUnreachable,
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
from luftpause.dataplane.intake.front_doors import (
    COUNT_TOKENS_PATH,
    MESSAGES_PATH,
    RESPONSES_PATH,
    FrontDoors,
    api_of,
)
from luftpause.dataplane.intake.front_doors import error_body as api_error_body
from luftpause.dataplane.intake.run_identity import RunIdentity
from luftpause.dataplane.intake.turns import TurnIntake
from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.link.runs import RunTable
from luftpause.dataplane.relay import turn_spans
from luftpause.dataplane.relay.loop import FailOver, Relay
from luftpause.dataplane.relay.upstream import Upstream
from luftpause.dataplane.server.answer_metrics import CLIENT_LEFT
from luftpause.dataplane.server.asgi import (
    WATCH_AFTER_S,
    BodyCutShort,
    ClientGone,
    Exchange,
    Headers,
    Receive,
    Scope,
    Send,
    StreamBroken,
)
from luftpause.dataplane.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from luftpause.dataplane.server.metrics import DataplaneMetrics
from luftpause.dataplane.server.token_count import count_tokens
from luftpause.dataplane.tool_calls import ToolCallTable
from luftpause.dataplane.turn import RUN_ID_HEADER, Turn
from luftpause.orphans import exit_with_parent
from luftpause.scheduler.core.policies.expiry import TURN_EXPIRY_S
from luftpause.v1 import scheduler_pb2 as pb

log = logging.getLogger("luftpause.dataplane")

ENGINE_READ_TIMEOUT_ENV = "LUFTPAUSE_ENGINE_READ_TIMEOUT_S"
"""Overrides the engine read timeout (seconds), for tests; by default the scheduler's turn expiry."""
PRUNE_EVERY_S = 60.0
"""How often expired runs, tool-call ids and ended runs are forgotten (one task for all three); a
sixth of ``[dataplane] run_expiry_s`` when that is shorter."""
MAX_ENDED_RUNS = 100_000
"""Runs ended by ``DELETE /v1/runs/{id}`` remembered (for the tool-call ids' ttl), oldest first out."""
DECIDE_PATH = "/v1/decide"
TURN_PATHS = frozenset({"/v1/chat/completions", MESSAGES_PATH, RESPONSES_PATH, DECIDE_PATH})
"""The routes whose answers ``luftpause_dataplane_turn_responses_total`` counts by status."""

_JSON: Headers = [(b"content-type", b"application/json")]
_RUN_ID = RUN_ID_HEADER.encode()
_METRICS_HEAD: Headers = [(b"content-type", METRICS_CONTENT_TYPE.encode())]
_ANTHROPIC_VERSION = b"anthropic-version"
_MODELS_PREFIX = "/v1/models/"


class Dataplane:
    """ASGI application (``__call__``); granian's worker runs its lifespan (startup, shutdown)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        expiry_s = config.dataplane.run_expiry_s
        self.runs = RunTable(idle_expiry_s=expiry_s)
        self.tool_calls = ToolCallTable(ttl_s=expiry_s)
        self._prune_every_s = min(PRUNE_EVERY_S, expiry_s / 6)
        self.ended_runs: dict[str, float] = {}
        """Run id -> ``loop.time()`` its ``DELETE`` came, oldest first: a tool-call id it emitted
        no longer resolves to it. A set beside the table rather than a run -> ids index, which
        would cost on every remembered id: at most ``MAX_ENDED_RUNS`` entries, measured 151 bytes
        each for 40-byte ids (15 MB when full), 367 bytes at the 256-byte limit (37 MB)."""
        self.identity = RunIdentity(self.runs, self.tool_calls, self.ended_runs)
        self._prune_task: asyncio.Task[None] | None = None
        # Stable across restarts on the same host and port: the Resync of a restarted dataplane
        # then releases what the crashed one held.
        dataplane_id = f"dp-{socket.gethostname()}-{config.dataplane.listen}"
        self.link = SchedulerLink(
            config.dataplane.scheduler,
            self.runs,
            dataplane_id,
            credentials=LinkCredentials.from_config(config),
            idle_affinity=config.scheduler.idle_affinity != "off",
        )
        self.access = Access.from_config(config)
        """Who may use the ``/v1`` routes, and as which caller (:mod:`luftpause.auth.callers`)."""
        self._context_lengths: dict[str, int] = {}
        """Model -> the largest context length (tokens) its replicas' engines report, from the
        scheduler's replica set: a turn's output-token cap where ``[dataplane] max_tokens`` names
        none."""
        self.intake = TurnIntake(self.access, self.identity, self._now, self.token_cap)
        """What a ``/v1`` request becomes: its access, class, caller, run and turn."""
        self._models = config.models
        self.models_body = models_body(self._models, anthropic=False)
        self.anthropic_models_body = models_body(self._models, anthropic=True)
        self.front_doors = FrontDoors(config.replicas)
        self._upstream: Upstream | None = None
        self._replicas = {replica.name: replica for replica in config.replicas}
        self.link.on_replicas = self._learn_replicas  # the scheduler's set replaces the file's
        self._relay: Relay | None = None
        self._held = 0  # turns whose Admit is out
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's, taken once in startup()
        self.metrics = DataplaneMetrics(
            in_flight=lambda: 0 if self._relay is None else self._relay.in_flight(),
            held=lambda: self._held,
            connected=lambda: self.link.connected,
            healthy_replicas=lambda: self.link.healthy_replicas,
            replicas=self._replicas,
            callers=configured_callers(config, self.access),
            usage_window_s=config.dataplane.usage_window_s,
        )
        self._server_address = split_host_port(config.dataplane.listen)
        self.link.on_placed = self.metrics.placed  # turns that waited for a decision, not leased ones

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
        # In granian's worker: a worker whose main process was SIGKILLed would go on serving (and
        # stay connected to the scheduler) with nobody to stop it.
        exit_with_parent()
        self._loop = asyncio.get_running_loop()
        # No total timeout: a stream lasts as long as the engine generates. But an engine silent
        # for as long as the scheduler keeps a placed turn (TURN_EXPIRY_S) has failed the turn:
        # the scheduler has dropped it by then, so it is answered 502 (or its stream is broken).
        read_timeout = float(os.environ.get(ENGINE_READ_TIMEOUT_ENV) or TURN_EXPIRY_S)
        self._upstream = Upstream(read_timeout)
        self._upstream.start()
        self._relay = Relay(
            self._upstream,
            self.link,
            self.runs,
            self.metrics,
            self.tool_calls,
            self.config.dataplane.failover,
        )
        self._prune_task = self._loop.create_task(self._prune_forever())
        await self.link.start()

    async def _prune_forever(self) -> None:
        """Every ``PRUNE_EVERY_S`` seconds (or a sixth of the run expiry): forget idle runs, expired
        tool-call ids and ended runs older than the tool-call ids' ttl (no id of theirs can be
        looked up any more)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._prune_every_s)
            now = loop.time()
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
        if self._upstream is not None:
            await self._upstream.close()

    def token_cap(self, model: str) -> int | None:
        """The most output tokens a turn of ``model`` may ask for: ``[dataplane] max_tokens`` for
        it, else the largest context length its replicas report, else ``None`` (no cap)."""
        return self.config.dataplane.max_tokens.get(model) or self._context_lengths.get(model)

    def _now(self) -> float:
        """The worker loop's time (seconds): a turn's ``arrived``, a run's last activity."""
        assert self._loop is not None
        return self._loop.time()

    def _learn_replicas(self, replicas: pb.ReplicaSet) -> None:
        """The scheduler's replica set (the source of truth: the admin API and SIGHUP change it):
        turns go to these replicas and ``/v1/models`` lists their models from now on. A spec
        this dataplane cannot read is kept as it was, logged."""
        learned: dict[str, ReplicaConfig] = {}
        lengths: dict[str, int] = {}
        for spec in replicas.replicas:
            if spec.max_model_len:
                for model in spec.models:
                    lengths[model] = max(lengths.get(model, 0), spec.max_model_len)
            try:
                learned[spec.name] = ReplicaConfig.model_validate(
                    {
                        "name": spec.name,
                        "url": spec.url,
                        "models": tuple(spec.models),
                        "kind": spec.kind or "generative",
                        "api_key_env": spec.api_key_env or None,
                        "priority": spec.priority or None,
                        "apis": tuple(spec.apis) or ("chat",),
                    }
                )
            except ValidationError as exc:
                log.error("replica %r from the scheduler refused: %s", spec.name, exc)
                if spec.name in self._replicas:
                    learned[spec.name] = self._replicas[spec.name]
        if learned.keys() != self._replicas.keys():
            log.info("replicas from the scheduler: %s", ", ".join(learned) or "none")
        self._replicas = learned
        self._context_lengths = lengths
        self._models = list(dict.fromkeys(m for r in learned.values() for m in r.models))
        self.models_body = models_body(self._models, anthropic=False)
        self.anthropic_models_body = models_body(self._models, anthropic=True)
        self.front_doors = FrontDoors(list(learned.values()))

    # --- routing ---------------------------------------------------------------------------------

    async def _http(self, exchange: Exchange) -> None:
        try:
            await self._answer(exchange)
        finally:
            if exchange.path in TURN_PATHS:
                self.metrics.answers.responded(exchange.status or CLIENT_LEFT)

    async def _answer(self, exchange: Exchange) -> None:
        """Route the request; answer an error of its with the JSON error body."""
        try:
            await self._route(exchange)
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

    async def _route(self, exchange: Exchange) -> None:
        path, method = exchange.path, exchange.method
        if path == "/health":
            allow(path, method, "GET", "HEAD")
            health = {
                "status": "ok",
                "scheduler": "connected" if self.link.connected else "connecting",
                "runs": len(self.runs.runs),
                "in_flight": 0 if self._relay is None else self._relay.in_flight(),
                "held": self._held,
                "leases": self.link.leases(),
                "leased_turns_total": self.link.leased_turns,
            }
            await exchange.respond(200, _JSON, orjson.dumps(health))
            return
        if path == "/metrics":
            allow(path, method, "GET", "HEAD")
            await exchange.respond(200, _METRICS_HEAD, self.metrics.exposition())
            return
        if path == "/status" or path == "/admin/usage":
            allow(path, method, "GET", "HEAD")
            self._authorize_operator(exchange)
            usage = self.metrics.answers.usage.report()
            await exchange.respond(200, _JSON, orjson.dumps({"usage": usage} if path == "/status" else usage))
            return
        if path == "/livez" or path == "/readyz":
            allow(path, method, "GET", "HEAD")
            status, body = probes.LIVE if path == "/livez" else probes.report(self.readiness())
            await exchange.respond(status, _JSON, body)
            return
        if not path.startswith("/v1/"):
            raise NotFound(f"no route {method} {path}")
        self.intake.authorize(exchange)
        if path == "/v1/chat/completions":
            allow(path, method, "POST")
            await self._chat_completions(exchange)
        elif path == DECIDE_PATH:
            allow(path, method, "POST")
            await self._decide(exchange)
        elif path == MESSAGES_PATH:
            allow(path, method, "POST")
            await self._front_door(exchange, "messages")
        elif path == RESPONSES_PATH:
            allow(path, method, "POST")
            await self._front_door(exchange, "responses")
        elif path == COUNT_TOKENS_PATH:
            allow(path, method, "POST")
            raw = await read_body(exchange)
            payload, model = json_with_model(raw)
            replica, plan = self.front_doors.count_plan(payload, raw, model)
            assert self._relay is not None
            await exchange.respond(200, _JSON, await count_tokens(self._relay.pool_of(replica), plan))
        elif path == "/v1/models":
            allow(path, method, "GET", "HEAD")
            anthropic = wants_anthropic(exchange.header(_ANTHROPIC_VERSION))
            await exchange.respond(200, _JSON, self.anthropic_models_body if anthropic else self.models_body)
        elif path.startswith(_MODELS_PREFIX) and len(path) > len(_MODELS_PREFIX):
            allow(path, method, "GET", "HEAD")
            model = path[len(_MODELS_PREFIX) :]
            found = model_body(self._models, model, wants_anthropic(exchange.header(_ANTHROPIC_VERSION)))
            if found is None:
                raise NotFound(f"no replica serves model {model!r}")
            await exchange.respond(200, _JSON, found)
        elif path.startswith("/v1/runs/") and len(path) > len("/v1/runs/"):
            allow(path, method, "DELETE")
            run_id = path[len("/v1/runs/") :]
            if not acceptable_run_id(run_id):
                raise BadRequest(f"a run id is at most {RUN_ID_MAX_BYTES} bytes")
            self.runs.forget(run_id)
            ended = self.ended_runs
            ended.pop(run_id, None)
            assert self._loop is not None
            ended[run_id] = self._loop.time()
            if len(ended) > MAX_ENDED_RUNS:
                del ended[next(iter(ended))]
            self.link.report(pb.TurnEvent(run_id=run_id, kind=pb.TurnEvent.RUN_ENDED))
            await exchange.respond(204, [(_RUN_ID, run_id.encode())])
        else:
            raise NotFound(f"no route {method} {path}")

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

    # --- chat completions ------------------------------------------------------------------------

    async def _front_door(self, exchange: Exchange, api: Api) -> None:
        """``POST /v1/messages`` or ``POST /v1/responses``: planned (``front_doors``), then
        admitted and relayed as a chat turn is."""
        body = await read_body(exchange)
        await self._run_turn(self.intake.front_door_turn(exchange, api, body, self.front_doors), exchange)

    async def _chat_completions(self, exchange: Exchange) -> None:
        await self._run_turn(self.intake.chat_turn(exchange, await read_body(exchange)), exchange)

    async def _decide(self, exchange: Exchange) -> None:
        await self._run_turn(self.intake.single_pass_turn(exchange, await read_body(exchange)), exchange)

    async def _run_turn(self, turn: Turn, exchange: Exchange) -> None:
        """Admit ``turn``, forward it and relay its answer, racing the client leaving."""
        # Race the whole turn against the client leaving: a held turn must leave the queue at once
        # and a streaming one must close its engine request at once. The watch (granian's
        # receive() returning http.disconnect) cancels this very task: no asyncio.wait, and send()
        # is never relied on to notice (granian does not raise on a closed connection). It costs
        # two crossings into granian, so it begins only once the turn has lasted WATCH_AFTER_S, or
        # as soon as the turn must wait for the scheduler (_admit_and_forward).
        loop = self._loop
        assert loop is not None
        task = asyncio.current_task(loop)
        assert task is not None
        left = False

        def gone() -> None:
            nonlocal left
            left = True
            task.cancel()

        def watch() -> None:
            exchange.watch(gone)

        later = loop.call_later(WATCH_AFTER_S, watch)
        span = None
        if tracing.active:
            # This turn's span parents what it sends on: the scheduler's admit and the engine request.
            span = turn.span = turn_spans.start(turn, self._server_address)
            sent_on = tracing.headers_of(span)
            if sent_on:  # the client's tracestate rides on in the span's context
                turn.traceparent = sent_on[tracing.TRACEPARENT]
                turn.tracestate = sent_on.get(tracing.TRACESTATE)
        try:
            await self._admit_and_forward(turn, exchange, watch)
        except asyncio.CancelledError:
            if not left:
                raise  # cancelled from outside (the worker stopping), not by the client leaving
            task.uncancel()  # the client left: nobody to answer, nothing more to do
            if span is not None:
                span.set_attribute("luftpause.client_left", True)
        except DataplaneError as exc:
            exc.run_id = turn.run_id or None
            if span is not None:
                turn_spans.refused(span, exc.status, str(exc))
            raise
        except StreamBroken:
            raise  # the answer began (the span has the failure): granian aborts the connection
        except Exception as exc:
            # A fault of ours: answered 500 as any other, still naming the turn's run.
            log.error("turn %s failed", turn.turn_id, exc_info=exc)
            error = DataplaneError(f"internal error: {type(exc).__name__}")
            error.run_id = turn.run_id or None
            if span is not None:
                turn_spans.refused(span, error.status, str(error))
            raise error from None
        finally:
            later.cancel()
            exchange.unwatch()
            if span is not None:
                span.end()

    async def _admit_and_forward(self, turn: Turn, exchange: Exchange, watch: Callable[[], None]) -> None:
        assert self._relay is not None
        name = None
        if not turn.single_pass:
            # Placed at once under a capacity lease when one allows it: no round trip, no protobuf
            # request, the turn reported after (luftpause.dataplane.link.admission).
            name = self.link.place_leased(
                turn.turn_id, turn.run_id, turn.model, turn.service_class, turn.caller, turn.traceparent
            )
        if name is None:
            watch()  # the turn may be held: its client leaving must take it out of the queue at once
            name = await self._admit(turn)
        failover = self.config.dataplane.failover
        if failover.undelivered or failover.retry_statuses:
            turn.failovers_left = 1
        while True:
            replica = self._replicas.get(name)
            if replica is None:
                self._relay.abandoned(turn)
                if turn.new_run:
                    self.runs.forget_unplaced(turn.run_id)
                self.metrics.turn_ended("failed", turn.service_class)
                raise DataplaneError(
                    f"the scheduler placed the turn on replica {name!r}, "
                    "which this dataplane's configuration does not name"
                )
            translation = turn.translation  # a native send drops it; another replica may need it
            try:
                await self._relay.forward(turn, replica, exchange)
                return
            except FailOver as exc:
                # Nothing reached the client and the turn was reported failed (with its replica
                # unreachable, the scheduler has taken that one out of rotation): it is admitted
                # again, through the scheduler (never a lease), to go to another replica.
                turn = turn.again(translation)
                self.metrics.failed_over("unreachable" if exc.unreachable else "status")
                log.warning(
                    "turn of run %s: %s; admitted again as turn %s for another replica",
                    turn.run_id,
                    exc,
                    turn.turn_id,
                    extra={"run_id": turn.run_id, "turn_id": turn.turn_id, "replica": replica.name},
                )
                watch()
                try:
                    name = await self._admit(turn)
                except DataplaneError as refused:
                    if refused.status != 502:
                        raise
                    # no other replica: the client hears what happened to its turn first
                    raise EngineUnreachable(f"{exc}; {refused}") from None

    async def _admit(self, turn: Turn) -> str:
        """Ask the scheduler to place ``turn``: the replica's name. Raises :class:`DataplaneError`
        when it refuses the turn or fails the stream."""
        assert self._relay is not None
        request = pb.AdmitRequest(
            turn_id=turn.turn_id,
            run_id=turn.run_id,
            model=turn.model,
            service_class=turn.service_class,  # type: ignore[arg-type]
            caller=turn.caller,
            dataplane_id=self.link.dataplane_id,
            single_pass=turn.single_pass,
            failover_from=turn.failover_from,
        )
        if turn.traceparent:
            request.traceparent = turn.traceparent
        self._held += 1
        try:
            reply = await self.link.admit(request, leased_first=False)
        except BaseException as exc:
            # The client left (or the link failed) while the Admit was out: the placement may cross
            # the cancel on the wire, so tell the scheduler to undo whatever it did.
            self._relay.abandoned(turn)
            if turn.new_run:
                self.runs.forget_unplaced(turn.run_id)
            if isinstance(exc, grpc.aio.AioRpcError):
                self.metrics.turn_ended("failed", turn.service_class)
                raise DataplaneError(f"scheduler failed: {exc.code().name}: {exc.details()}", 503) from None
            self.metrics.turn_ended("abandoned", turn.service_class)
            raise
        finally:
            self._held -= 1
        if reply.WhichOneof("outcome") == "refused":
            if turn.new_run:
                self.runs.forget_unplaced(turn.run_id)  # unknown model and the like: nothing recorded
            self.metrics.turn_ended("refused", turn.service_class)
            if reply.refused.http_status == 429:  # a protection limit: Retry-After with it
                raise TooManyRequests(reply.refused.reason, reply.refused.retry_after_s or 1)
            raise DataplaneError(reply.refused.reason, reply.refused.http_status or 503)
        return reply.placed.replica


def configured_callers(config: Config, access: Access) -> list[str]:
    """The callers the configuration names: the caller keys' and ``[scheduler.protection]
    callers``; their roots are the caller labels of the metrics and the usage."""
    keyed = access.keys.callers if access.keys is not None else []
    return [*keyed, *config.scheduler.protection.callers]


def create_app(config: Config | None = None) -> Dataplane:
    """Build the app from ``config``, else from ``LUFTPAUSE_CONFIG`` (or the embedded default) and
    the environment (:func:`luftpause.config.load_config`); granian's loader.

    Runs in the worker process, so that is where spans are exported from when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (:func:`luftpause.tracing.setup`).
    """
    tracing.setup(tracing.DATAPLANE_SERVICE)
    return Dataplane(config if config is not None else load_config())
