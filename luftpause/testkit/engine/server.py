"""The simulated engine's HTTP server (aiohttp) and its in-process handle.

Routes, as SGLang and vLLM serve them:

* ``POST /v1/chat/completions``: streamed or not (see :mod:`.wire`, :mod:`.replies`);
* with ``EngineSettings.apis``, ``POST /v1/messages`` (Anthropic Messages) and ``POST
  /v1/responses`` (OpenAI Responses) served natively, the same turn in their formats
  (:mod:`.dialects`), as vLLM and llama.cpp's server serve them;
* ``POST /tokenize``: the prompt's token count, in vLLM's shape (:mod:`.tokenize`);
* ``GET /health`` -> ``{}``; ``GET /v1/models``; ``GET /metrics`` (see :mod:`.metrics`);
* ``GET /server_info``, ``/get_server_info``, ``/model_info``, ``/get_model_info``: the little
  SGLang's router asks of a worker;
* ``GET /testkit/sent/{id}``: the exact response bytes sent for the completion ``id`` (one of the
  last ``SENT_KEPT``), so a test can check that a proxy relayed them unchanged (a completion cut
  by a fault is not kept);
* ``GET /testkit/received/{id}``: the request headers that completion ``id`` arrived with, as a
  JSON object of lower-cased names, so a test can check what a proxy sent upstream;
* ``GET /testkit/request/{id}``: the exact request body bytes completion ``id`` arrived with
  (one of the last ``SENT_KEPT``, at most ``REQUEST_BYTES_KEPT`` bytes in all, oldest dropped
  first; a body larger than that is not kept, and its id answers 404 saying so);
* ``GET /testkit/started``: the ids of the last ``SENT_KEPT`` chat completions in the order they
  got a running slot (a JSON array), so a test can see how the waiting queue was served;
* ``GET /testkit/cost/{id}``: what completion ``id`` cost in simulated time, computed rather
  than measured: ``{"prompt_tokens", "cached_tokens", "completion_tokens", "prefill_s",
  "decode_s"}`` (seconds, after ``time_scale``; ``decode_s`` is the sum of the decode steps of its
  tokens, each as long as the running batch made it);
* ``POST /classify`` and ``POST /v1/classify``: a single pass (see :mod:`.classify`).

Every response carries ``x-luftpause-simulated: 1``; chat completions also say
``"system_fingerprint": "luftpause-simulator"`` and ``/server_info`` ``"simulated": true``.

A request's life: validated (400/404 at once), queued for a running slot (in arrival order, or by
``priority`` when the engine is set to), then, once running, a lookup in the replica's prefix
cache (:mod:`.prefix_cache`), prefill of the prompt tokens not found there, the prompt's prefix
cached, then one output token per decode step (:class:`.costs.CostModel`: longer as more requests
run), and at the end the reply cached after its prompt, for the run's next turn. The HTTP handler is
cancelled when the client disconnects (aiohttp's ``handler_cancellation``), which takes the
request out of the queue or frees its slot at once. A request may instead get a fault
(:mod:`.faults`): a refusal, a stream cut, a stall, a slow stream or a closed connection. With
``idle_close_ms`` a request on a connection idle that long is dropped and the connection reset
(:mod:`.idle_close`). How the bytes are written, paced or broken off is :mod:`.sending`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from aiohttp import web

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.backend import EngineBackend, Held
from luftpause.testkit.engine.classify import classification_response, parse_classify_request, text_tokens
from luftpause.testkit.engine.costs import estimate_prompt_tokens
from luftpause.testkit.engine.dialects import DIALECTS, Dialect, Writer
from luftpause.testkit.engine.faults import (
    SLOW_PIECE_BYTES,
    CloseConnection,
    DieMidStream,
    ErrorMidStream,
    Fault,
    FaultDice,
    Slow,
    Stall,
    StatusFault,
)
from luftpause.testkit.engine.idle_close import idle_close_middleware
from luftpause.testkit.engine.metrics import CONTENT_TYPE_LATEST
from luftpause.testkit.engine.model import EngineModel
from luftpause.testkit.engine.prefix_cache import PrefixCache, PrefixPath, prefix_path
from luftpause.testkit.engine.recording import REQUEST_BYTES_KEPT, SENT_KEPT, KeptRequestBodies, keep
from luftpause.testkit.engine.replies import Reply, plan_reply
from luftpause.testkit.engine.scheduling import EngineStats
from luftpause.testkit.engine.sending import abort, send_events, send_then_die, send_then_error, write_paced
from luftpause.testkit.engine.settings import EngineSettings
from luftpause.testkit.engine.slotted import SlottedBackend
from luftpause.testkit.engine.stepped import SteppedBackend
from luftpause.testkit.engine.tokenize import tokenize

__all__ = [
    "REQUEST_BYTES_KEPT",
    "SENT_KEPT",
    "KeptRequestBodies",
    "RunningEngine",
    "SimulatedEngine",
    "start_engine",
]

# Seconds that close() gives streams still running before aiohttp cancels them.
SHUTDOWN_GRACE_S = 0.5

# Set to "1" on every response of the simulator.
SIMULATED_HEADER = "x-luftpause-simulated"

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class SimulatedEngine:
    """One engine replica: its settings, counters, engine-time backend (:mod:`.slotted`, or
    :mod:`.stepped` with a profile) and routes (:meth:`app`)."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.stats = EngineStats()
        self.started = int(time.time())
        self._sent: OrderedDict[str, bytes] = OrderedDict()
        self._received: OrderedDict[str, dict[str, str]] = OrderedDict()
        self.request_bodies = KeptRequestBodies()
        self._started: deque[str] = deque(maxlen=SENT_KEPT)
        self._costs_kept: OrderedDict[str, dict[str, float]] = OrderedDict()
        self.backend: EngineBackend
        if settings.profile is None:
            self.backend = SlottedBackend(settings, self.stats, self._started)
        else:
            self.backend = SteppedBackend(settings, self.stats, self._started)
        self._dice = FaultDice(settings.fault, settings.fault_rate, settings.seed)

    @property
    def cache(self) -> PrefixCache:
        """The slot model's prefix cache (the step model's lives in its KV pool)."""
        if not isinstance(self.backend, SlottedBackend):
            raise AttributeError("the step model keeps its prefix cache in its KV pool: see backend.model")
        return self.backend.cache

    @property
    def engine_model(self) -> EngineModel | None:
        """The step model's :class:`~.model.EngineModel` (``None`` on the slot model)."""
        return self.backend.model if isinstance(self.backend, SteppedBackend) else None

    def app(self) -> web.Application:
        middlewares = []
        if self.settings.idle_close_ms is not None:
            middlewares.append(idle_close_middleware(self.settings.idle_close_ms, self.stats))
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/tokenize", functools.partial(tokenize, self.settings.models))
        for api in self.settings.apis:
            if api != "chat":
                dialect = DIALECTS[api]
                app.router.add_post(dialect.path, functools.partial(self.answer, dialect))
        # vLLM serves /classify, SGLang /v1/classify; the shape is the same.
        for path in ("/classify", "/v1/classify"):
            app.router.add_post(path, self.classify)
        app.on_response_prepare.append(_mark_simulated)
        app.router.add_get("/health", self.health)
        app.router.add_get("/testkit/sent/{id}", self.sent)
        app.router.add_get("/testkit/received/{id}", self.received)
        app.router.add_get("/testkit/request/{id}", self.request_body)
        app.router.add_get("/testkit/started", self.started_order)
        app.router.add_get("/testkit/cost/{id}", self.cost)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self.model_info)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(self, request: web.Request) -> web.Response:
        # max_model_len: the context length, as vLLM and SGLang report it
        context = self.backend.server_info().get("context_length")
        data = [
            {
                "id": m,
                "object": "model",
                "created": self.started,
                "owned_by": "luftpause-sim",
                "root": m,
                **({"max_model_len": context} if isinstance(context, int) else {}),
            }
            for m in self.settings.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def sent(self, request: web.Request) -> web.Response:
        body = self._sent.get(request.match_info["id"])
        if body is None:
            return web.json_response({"error": {"message": "not recorded"}}, status=404)
        return web.Response(body=body, content_type="application/octet-stream")

    async def received(self, request: web.Request) -> web.Response:
        headers = self._received.get(request.match_info["id"])
        if headers is None:
            return web.json_response({"error": {"message": "not recorded"}}, status=404)
        return web.json_response(headers)

    async def request_body(self, request: web.Request) -> web.Response:
        completion_id = request.match_info["id"]
        body = self.request_bodies.get(completion_id)
        if body is not None:
            return web.Response(body=body, content_type="application/octet-stream")
        size = self.request_bodies.too_large(completion_id)
        if size is None:
            return web.json_response({"error": {"message": "not recorded"}}, status=404)
        message = (
            f"request body of {completion_id} not kept: {size} bytes, more than the "
            f"{self.request_bodies.limit_bytes} bytes of request bodies the simulator keeps"
        )
        return web.json_response({"error": {"message": message}}, status=404)

    async def started_order(self, request: web.Request) -> web.Response:
        return web.json_response(list(self._started))

    async def cost(self, request: web.Request) -> web.Response:
        cost = self._costs_kept.get(request.match_info["id"])
        if cost is None:
            return web.json_response({"error": {"message": "not recorded"}}, status=404)
        return web.json_response(cost)

    def _record(self, completion_id: str, body: bytes, held: Held, prompt_tokens: int, count: int) -> None:
        keep(self._sent, completion_id, body)
        keep(
            self._costs_kept,
            completion_id,
            {
                "prompt_tokens": prompt_tokens,
                "cached_tokens": held.cached_tokens,
                "completion_tokens": count,
                "prefill_s": held.prefill_s,
                "decode_s": held.decode_s,
            },
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.backend.render_metrics(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def server_info(self, request: web.Request) -> web.Response:
        model = self.settings.models[0]
        return web.json_response(
            {
                "model_path": model,
                "served_model_name": model,
                "tokenizer_path": model,
                "tp_size": 1,
                "dp_size": 1,
                "schedule_policy": self.settings.priority_order,
                "version": "luftpause-simulator",
                "simulated": True,
                **self.backend.server_info(),
            }
        )

    async def model_info(self, request: web.Request) -> web.Response:
        model = self.settings.models[0]
        return web.json_response(
            {"model_path": model, "tokenizer_path": model, "is_generation": True, "simulated": True}
        )

    async def classify(self, request: web.Request) -> web.Response:
        """``POST /classify`` (vLLM's classification API; see :mod:`.classify`): one single pass,
        which waits for a running slot like any request and costs the prefill of its inputs."""
        try:
            job = parse_classify_request(await request.read(), self.settings.models)
        except wire.RequestError as exc:
            return web.json_response(exc.body(), status=exc.status)
        self.stats.requests += 1
        prompt_tokens = sum(text_tokens(text) for text in job.inputs)
        refusal = self.backend.refusal(prompt_tokens, 1, 1)
        if refusal is not None:
            return web.json_response(refusal.body(), status=refusal.status)
        try:
            async with self.backend.running(job.model, prompt_tokens, None, job.priority, None, None, None):
                pass
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        self._count_completed(prompt_tokens, 0, 0)
        return web.json_response(classification_response(job, self.settings.labels, self.settings.seed))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (OpenAI "Create chat completion").

        With a fault (the body's ``luftpause_fault``, else the model's, else the configured one;
        see :mod:`.faults`) the engine misbehaves as that fault says instead of answering normally.
        """
        return await self.answer(DIALECTS["chat"], request)

    async def answer(self, dialect: Dialect, request: web.Request) -> web.StreamResponse:
        """A turn in ``dialect``'s API (``/v1/chat/completions``, or natively ``/v1/messages`` and
        ``/v1/responses``, :mod:`.dialects`): the same engine time, reply and faults, in its wire
        format."""
        raw = await request.read()
        try:
            chat = dialect.parse(raw, self.settings.models)
        except wire.RequestError as exc:
            return web.json_response(dialect.request_error(exc), status=exc.status)
        self.stats.requests += 1
        fault = chat.fault
        if fault is None:
            fault = self.settings.model_fault(chat.model) or self._dice.draw()
        if fault is not None:
            self.stats.faults[fault.kind] += 1
        if isinstance(fault, StatusFault):
            # Refused before any slot is taken, as an engine's own admission refuses.
            return web.json_response(dialect.refusal(fault), status=fault.status, headers=fault.headers())
        if isinstance(fault, CloseConnection):
            if request.transport is not None:
                request.transport.close()
            # aiohttp finds the connection closed when it writes this and drops it quietly.
            return web.Response()
        prompt_tokens = estimate_prompt_tokens(chat.messages)
        path = prefix_path(chat.model, chat.messages)
        reply = plan_reply(
            chat.messages,
            chat.tools,
            chat.tool_choice,
            chat.parallel_tool_calls,
            limit=chat.max_tokens or self.settings.max_tokens,
            tool_rounds=self.settings.tool_rounds,
            seed=self.settings.seed,
        )
        refusal = self.backend.refusal(prompt_tokens, reply.count, self._max_tokens(chat))
        if refusal is not None:
            return web.json_response(refusal.body(), status=refusal.status)
        ids = dialect.ids(chat.model)
        keep(self._received, ids.id, {k.lower(): v for k, v in request.headers.items()})
        self.request_bodies.keep(ids.id, raw)
        writer = dialect.writer(ids, reply, chat)
        if chat.stream:
            return await self._answer_streamed(request, chat, ids, reply, prompt_tokens, path, fault, writer)
        if isinstance(fault, ErrorMidStream):
            body = (
                dialect.refusal(StatusFault(500, message=fault.message))
                if dialect.api != "chat"
                else fault.body()
            )
            return web.json_response(body, status=500)
        return await self._answer_whole(request, chat, ids, reply, prompt_tokens, path, fault, writer)

    async def _answer_whole(
        self,
        request: web.Request,
        chat: wire.ChatRequest,
        ids: wire.ResponseIds,
        reply: Reply,
        prompt_tokens: int,
        path: PrefixPath,
        fault: Fault | None,
        writer: Writer,
    ) -> web.StreamResponse:
        """A non-streamed answer: decode unseen, then one answer object (``chat.completion``, or
        the dialect's)."""
        try:
            async with self._running(chat, prompt_tokens, path, ids, reply) as held:
                if isinstance(fault, Stall):
                    await asyncio.sleep(fault.seconds)
                async for _ in self.backend.decode(held):
                    pass  # nobody sees the tokens until the end
        except asyncio.CancelledError:
            # The client went away: its queue place or slot is already given back.
            self.stats.disconnected += 1
            raise
        body = json.dumps(writer.whole(prompt_tokens, held.cached_tokens)).encode()
        if not isinstance(fault, (DieMidStream, Slow)):
            self._count_completed(prompt_tokens, reply.count, held.cached_tokens)
            self._record(ids.id, body, held, prompt_tokens, reply.count)
            return web.Response(body=body, content_type="application/json")
        # Status line and headers now, with the length of the whole answer, so that a client
        # sees a 200 whose body is cut (DieMidStream) or trickles in (Slow).
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        try:
            await response.prepare(request)
            if isinstance(fault, DieMidStream):
                await abort(request)
                return response
            pieces = [body[i : i + SLOW_PIECE_BYTES] for i in range(0, len(body), SLOW_PIECE_BYTES)]
            await write_paced(response, pieces, fault.delay_ms / 1000, first=True)
            await response.write_eof()
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        except ConnectionResetError:
            self.stats.disconnected += 1
            return response
        self._count_completed(prompt_tokens, reply.count, held.cached_tokens)
        self._record(ids.id, body, held, prompt_tokens, reply.count)
        return response

    async def _answer_streamed(
        self,
        request: web.Request,
        chat: wire.ChatRequest,
        ids: wire.ResponseIds,
        reply: Reply,
        prompt_tokens: int,
        path: PrefixPath,
        fault: Fault | None,
        writer: Writer,
    ) -> web.StreamResponse:
        """A streamed answer: headers at once (queued or not), then events at the pace of decode."""
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            if not isinstance(fault, Stall):
                await response.prepare(request)
            async with self._running(chat, prompt_tokens, path, ids, reply) as held:
                if isinstance(fault, Stall):
                    await asyncio.sleep(fault.seconds)
                    await response.prepare(request)
                events = self._events(writer, reply, prompt_tokens, held)
                if isinstance(fault, DieMidStream):
                    await send_then_die(request, response, events, fault.after_chunks)
                    return response
                if isinstance(fault, ErrorMidStream):
                    await send_then_error(response, events, fault, writer)
                    await response.write_eof()
                    return response
                pace_s = fault.delay_ms / 1000 if isinstance(fault, Slow) else 0.0
                sent = await send_events(response, events, pace_s)
            await response.write_eof()
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        except ConnectionResetError:
            # A write found the connection closed before aiohttp cancelled this handler; returning
            # instead of raising keeps aiohttp from logging a client's departure as a server error.
            self.stats.disconnected += 1
            return response
        self._count_completed(prompt_tokens, reply.count, held.cached_tokens)
        self._record(ids.id, sent, held, prompt_tokens, reply.count)
        return response

    def _count_completed(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        self.stats.completed += 1
        self.stats.prompt_tokens += prompt_tokens
        self.stats.cached_tokens += cached_tokens
        self.stats.completion_tokens += completion_tokens

    def _max_tokens(self, chat: wire.ChatRequest) -> int:
        """The request's limit on output tokens (the engine's default when it sets none)."""
        return chat.max_tokens or self.settings.max_tokens

    def _running(
        self,
        chat: wire.ChatRequest,
        prompt_tokens: int,
        path: PrefixPath,
        ids: wire.ResponseIds,
        reply: Reply,
    ) -> AbstractAsyncContextManager[Held]:
        """Engine time for a chat completion (see :meth:`.backend.EngineBackend.running`)."""
        return self.backend.running(
            chat.model, prompt_tokens, path, chat.priority, ids.id, reply, self._max_tokens(chat)
        )

    async def _events(
        self, writer: Writer, reply: Reply, prompt_tokens: int, held: Held
    ) -> AsyncGenerator[list[bytes], None]:
        """The server-sent events of ``reply``, a list at a time as decode makes them due; the
        last list holds the end (chat: the finish chunk, the usage chunk when asked, and
        ``data: [DONE]``)."""
        emitted, opened = 0, False
        async for due in self.backend.decode(held):
            # The opening first: a writer numbers its events in the order it makes them.
            batch = [] if opened else writer.opening(prompt_tokens, held.cached_tokens)
            opened = True
            batch += [event for piece in reply.pieces(emitted, due) for event in writer.piece(piece)]
            emitted = due
            yield batch
        tail = [] if opened else writer.opening(prompt_tokens, held.cached_tokens)
        yield tail + writer.closing(prompt_tokens, held.cached_tokens)


async def _mark_simulated(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Every answer says it comes from a simulator, not a real engine."""
    response.headers[SIMULATED_HEADER] = "1"


@dataclass(slots=True)
class RunningEngine:
    """A simulated engine serving on loopback; ``url`` is ``http://host:port`` (no ``/v1``)."""

    engine: SimulatedEngine
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    @property
    def settings(self) -> EngineSettings:
        return self.engine.settings

    @property
    def cache(self) -> PrefixCache:
        return self.engine.cache

    async def close(self) -> None:
        """Stop listening and end every request in flight (their clients see the stream cut)."""
        await self.runner.cleanup()
        if isinstance(self.engine.backend, SteppedBackend):
            self.engine.backend.close()


async def start_engine(settings: EngineSettings, host: str = "127.0.0.1", port: int = 0) -> RunningEngine:
    """Serve a simulated engine on ``host:port`` (0 = any free port) in the running event loop.

    Raises ``OSError`` when the port cannot be bound.
    """
    engine = SimulatedEngine(settings)
    runner = web.AppRunner(
        engine.app(), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound: int = runner.addresses[0][1]
    return RunningEngine(engine, runner, host, bound)
