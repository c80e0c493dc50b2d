"""The simulated engine's HTTP server (aiohttp) and its in-process handle.

Routes, as SGLang and vLLM serve them:

* ``POST /v1/chat/completions``: streamed or not (see :mod:`.wire`, :mod:`.replies`);
* ``GET /health`` -> ``{}``; ``GET /v1/models``; ``GET /metrics`` (see :mod:`.metrics`);
* ``GET /server_info``, ``/get_server_info``, ``/model_info``, ``/get_model_info``: the little
  SGLang's router asks of a worker;
* ``GET /testkit/sent/{id}``: the exact response bytes sent for the completion ``id`` (one of the
  last ``SENT_KEPT``), so a test can check that a proxy relayed them unchanged (a completion cut
  by a fault is not kept);
* ``GET /testkit/received/{id}``: the request headers that completion ``id`` arrived with, as a
  JSON object of lower-cased names, so a test can check what a proxy sent upstream.

A request's life: validated (400/404 at once), queued for a running slot (FIFO), prefill
(:class:`.costs.CostModel`), then one output token per ``decode_ms``. The HTTP handler is
cancelled when the client disconnects (aiohttp's ``handler_cancellation``), which takes the
request out of the queue or frees its slot at once. A request may instead get a fault
(:mod:`.faults`): a refusal, a stream cut, a stall, a slow stream or a closed connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.classify import classification_response, parse_classify_request, text_tokens
from luftpause.testkit.engine.costs import CostModel, estimate_prompt_tokens
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
from luftpause.testkit.engine.metrics import CONTENT_TYPE_LATEST, ModelLoad, SglangMetrics
from luftpause.testkit.engine.replies import Reply, plan_reply
from luftpause.testkit.engine.scheduling import EngineStats, SlotPool
from luftpause.testkit.engine.settings import EngineSettings

# Shortest sleep between streamed tokens: below it, tokens that are due go out together in one
# write, so a tiny decode_ms keeps the total time of the model without a timer per token.
MIN_SLEEP_S = 0.001

# Most tokens sent in one write: with decode_ms 0 a huge max_tokens must not build one huge
# write nor hold the event loop from other requests.
MAX_TOKENS_PER_STEP = 64

# Seconds that close() gives streams still running before aiohttp cancels them.
SHUTDOWN_GRACE_S = 0.5

_T = TypeVar("_T")

# How many completed responses GET /testkit/sent/{id} (and .../received/{id}) can still show.
SENT_KEPT = 256

# Set to "1" on every response of the simulator.
SIMULATED_HEADER = "x-luftpause-simulated"

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class _HeldTokens:
    """KV-cache tokens one running request holds (prompt, then each decoded token)."""

    __slots__ = ("_load", "tokens")

    def __init__(self, load: ModelLoad) -> None:
        self._load = load
        self.tokens = 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens
        self._load.kv_tokens += tokens

    def release(self) -> None:
        self._load.kv_tokens -= self.tokens
        self.tokens = 0


class SimulatedEngine:
    """One engine replica: its settings, slots, counters and routes (:meth:`app`)."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.stats = EngineStats()
        self.started = int(time.time())
        self._pool = SlotPool(settings.slots, self.stats)
        self._costs = CostModel(settings)
        self._metrics = SglangMetrics(settings.models, settings.slots)
        self._load = {model: ModelLoad() for model in settings.models}
        self._sent: OrderedDict[str, bytes] = OrderedDict()
        self._received: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._dice = FaultDice(settings.fault, settings.fault_rate, settings.seed)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        # vLLM serves /classify, SGLang /v1/classify; the shape is the same.
        for path in ("/classify", "/v1/classify"):
            app.router.add_post(path, self.classify)
        app.on_response_prepare.append(_mark_simulated)
        app.router.add_get("/health", self.health)
        app.router.add_get("/testkit/sent/{id}", self.sent)
        app.router.add_get("/testkit/received/{id}", self.received)
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
        data = [
            {"id": m, "object": "model", "created": self.started, "owned_by": "luftpause-sim", "root": m}
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

    def _record(self, completion_id: str, body: bytes) -> None:
        _keep(self._sent, completion_id, body)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._metrics.render(self._load), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def server_info(self, request: web.Request) -> web.Response:
        model = self.settings.models[0]
        return web.json_response(
            {
                "model_path": model,
                "served_model_name": model,
                "tokenizer_path": model,
                "tp_size": 1,
                "dp_size": 1,
                "max_running_requests": self.settings.slots,
                "max_total_num_tokens": self.settings.slots * 8192,
                "version": "luftpause-sim",
            }
        )

    async def model_info(self, request: web.Request) -> web.Response:
        model = self.settings.models[0]
        return web.json_response({"model_path": model, "tokenizer_path": model, "is_generation": True})

    async def classify(self, request: web.Request) -> web.Response:
        """``POST /classify`` (vLLM's classification API; see :mod:`.classify`): one single pass,
        which waits for a running slot like any request and costs the prefill of its inputs."""
        try:
            job = parse_classify_request(await request.read(), self.settings.models)
        except wire.RequestError as exc:
            return web.json_response(exc.body(), status=exc.status)
        self.stats.requests += 1
        prompt_tokens = sum(text_tokens(text) for text in job.inputs)
        try:
            async with self._running(job.model, prompt_tokens):
                pass
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        self._count_completed(prompt_tokens, 0)
        return web.json_response(classification_response(job, self.settings.labels, self.settings.seed))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (OpenAI "Create chat completion").

        With a fault (the body's ``luftpause_fault``, else the configured one; see :mod:`.faults`)
        the engine misbehaves as that fault says instead of answering normally.
        """
        try:
            chat = wire.parse_chat_request(await request.read(), self.settings.models)
        except wire.RequestError as exc:
            return web.json_response(exc.body(), status=exc.status)
        self.stats.requests += 1
        fault = chat.fault if chat.fault is not None else self._dice.draw()
        if fault is not None:
            self.stats.faults[fault.kind] += 1
        if isinstance(fault, StatusFault):
            # Refused before any slot is taken, as an engine's own admission refuses.
            return web.json_response(fault.body(), status=fault.status, headers=fault.headers())
        if isinstance(fault, CloseConnection):
            if request.transport is not None:
                request.transport.close()
            # aiohttp finds the connection closed when it writes this and drops it quietly.
            return web.Response()
        prompt_tokens = estimate_prompt_tokens(chat.messages)
        reply = plan_reply(
            chat.messages,
            chat.tools,
            chat.tool_choice,
            chat.parallel_tool_calls,
            limit=chat.max_tokens or self.settings.max_tokens,
            tool_rounds=self.settings.tool_rounds,
            seed=self.settings.seed,
        )
        ids = wire.ResponseIds(chat.model)
        _keep(self._received, ids.id, {k.lower(): v for k, v in request.headers.items()})
        if chat.stream:
            return await self._answer_streamed(request, chat, ids, reply, prompt_tokens, fault)
        if isinstance(fault, ErrorMidStream):
            return web.json_response(fault.body(), status=500)
        return await self._answer_whole(request, chat, ids, reply, prompt_tokens, fault)

    async def _answer_whole(
        self,
        request: web.Request,
        chat: wire.ChatRequest,
        ids: wire.ResponseIds,
        reply: Reply,
        prompt_tokens: int,
        fault: Fault | None,
    ) -> web.StreamResponse:
        """A non-streamed answer: decode unseen, then one ``chat.completion`` object."""
        try:
            async with self._running(chat.model, prompt_tokens) as held:
                if isinstance(fault, Stall):
                    await asyncio.sleep(fault.seconds)
                await self._decode_unseen(reply.count, held)
        except asyncio.CancelledError:
            # The client went away: its queue place or slot is already given back.
            self.stats.disconnected += 1
            raise
        body = json.dumps(wire.completion(ids, reply, chat, prompt_tokens)).encode()
        if not isinstance(fault, (DieMidStream, Slow)):
            self._count_completed(prompt_tokens, reply.count)
            self._record(ids.id, body)
            return web.Response(body=body, content_type="application/json")
        # Status line and headers now, with the length of the whole answer, so that a client
        # sees a 200 whose body is cut (DieMidStream) or trickles in (Slow).
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        try:
            await response.prepare(request)
            if isinstance(fault, DieMidStream):
                await _abort(request)
                return response
            pieces = [body[i : i + SLOW_PIECE_BYTES] for i in range(0, len(body), SLOW_PIECE_BYTES)]
            await _write_paced(response, pieces, fault.delay_ms / 1000, first=True)
            await response.write_eof()
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        except ConnectionResetError:
            self.stats.disconnected += 1
            return response
        self._count_completed(prompt_tokens, reply.count)
        self._record(ids.id, body)
        return response

    async def _answer_streamed(
        self,
        request: web.Request,
        chat: wire.ChatRequest,
        ids: wire.ResponseIds,
        reply: Reply,
        prompt_tokens: int,
        fault: Fault | None,
    ) -> web.StreamResponse:
        """A streamed answer: headers at once (queued or not), then events at the pace of decode."""
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            if not isinstance(fault, Stall):
                await response.prepare(request)
            async with self._running(chat.model, prompt_tokens) as held:
                if isinstance(fault, Stall):
                    await asyncio.sleep(fault.seconds)
                    await response.prepare(request)
                events = self._events(chat, ids, reply, prompt_tokens, held)
                if isinstance(fault, DieMidStream):
                    await self._send_then_die(request, response, events, fault.after_chunks)
                    return response
                if isinstance(fault, ErrorMidStream):
                    await self._send_then_error(response, events, fault)
                    await response.write_eof()
                    return response
                pace_s = fault.delay_ms / 1000 if isinstance(fault, Slow) else 0.0
                sent = await self._send(response, events, pace_s)
            await response.write_eof()
        except asyncio.CancelledError:
            self.stats.disconnected += 1
            raise
        except ConnectionResetError:
            # A write found the connection closed before aiohttp cancelled this handler; returning
            # instead of raising keeps aiohttp from logging a client's departure as a server error.
            self.stats.disconnected += 1
            return response
        self._count_completed(prompt_tokens, reply.count)
        self._record(ids.id, sent)
        return response

    def _count_completed(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.stats.completed += 1
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens

    @asynccontextmanager
    async def _running(self, model: str, prompt_tokens: int) -> AsyncIterator[_HeldTokens]:
        """Wait for a slot (FIFO), then prefill; the block decodes. Counts go to ``/metrics``."""
        load = self._load[model]
        load.waiting += 1
        queued = True
        try:
            async with self._pool.slot():
                load.waiting -= 1
                queued = False
                load.running += 1
                held = _HeldTokens(load)
                held.add(prompt_tokens)
                try:
                    await asyncio.sleep(self._costs.prefill_seconds(prompt_tokens))
                    yield held
                finally:
                    load.running -= 1
                    held.release()
        finally:
            if queued:
                load.waiting -= 1

    async def _events(
        self,
        chat: wire.ChatRequest,
        ids: wire.ResponseIds,
        reply: Reply,
        prompt_tokens: int,
        held: _HeldTokens,
    ) -> AsyncGenerator[list[bytes], None]:
        """The server-sent events of ``reply``, a list at a time as decode makes them due; the
        last list holds the finish chunk, the usage chunk when asked, and ``data: [DONE]``."""
        head = wire.chunk(ids, {"role": "assistant", "content": ""})
        emitted = 0
        async for due in self._decode_schedule(reply.count):
            batch = [wire.piece_chunk(ids, reply, piece, chat) for piece in reply.pieces(emitted, due)]
            if emitted == 0:
                batch.insert(0, head)
            held.add(due - emitted)
            emitted = due
            yield batch
        tail = [wire.chunk(ids, {}, None, reply.finish_reason)]
        if emitted == 0:
            tail.insert(0, head)
        if chat.include_usage:
            tail.append(wire.usage_chunk(ids, prompt_tokens, reply.count))
        tail.append(wire.SSE_DONE)
        yield tail

    async def _send(
        self, response: web.StreamResponse, events: AsyncGenerator[list[bytes], None], pace_s: float
    ) -> bytes:
        """Write ``events``: each list in one write, or with ``pace_s`` > 0 (seconds) each event
        in its own write, ``pace_s`` apart. Returns every byte written, for ``GET /testkit/sent``."""
        sent = bytearray()
        async with aclosing(events):
            async for batch in events:
                if pace_s > 0:
                    await _write_paced(response, batch, pace_s, first=not sent)
                    sent += b"".join(batch)
                    continue
                data = b"".join(batch)
                sent += data
                await response.write(data)
        return bytes(sent)

    async def _send_then_die(
        self,
        request: web.Request,
        response: web.StreamResponse,
        events: AsyncGenerator[list[bytes], None],
        after_chunks: int,
    ) -> None:
        """Write the first ``after_chunks`` events (never ``[DONE]``), then abort the connection."""
        await _send_first(response, events, after_chunks)
        await _abort(request)

    async def _send_then_error(
        self,
        response: web.StreamResponse,
        events: AsyncGenerator[list[bytes], None],
        fault: ErrorMidStream,
    ) -> None:
        """Write the first ``after_chunks`` events, then the error event and ``[DONE]``."""
        await _send_first(response, events, fault.after_chunks)
        await response.write(wire.sse(fault.body()) + wire.SSE_DONE)

    async def _decode_unseen(self, count: int, held: _HeldTokens) -> None:
        """Decode ``count`` tokens that nobody sees until the end (a non-streamed answer)."""
        done = 0
        async for due in self._decode_schedule(count):
            held.add(due - done)
            done = due

    async def _decode_schedule(self, count: int) -> AsyncIterator[int]:
        """Yield how many of ``count`` tokens are decoded by now, each time more are: token ``i``
        is due ``(i + 1) * decode_ms`` after the first decode step starts."""
        decode_s = self._costs.decode_seconds()
        loop = asyncio.get_running_loop()
        start = loop.time()
        done = 0
        while done < count:
            elapsed = loop.time() - start
            due = count if decode_s <= 0 else min(count, int(elapsed / decode_s + 1e-9))
            if due > done:
                done = min(due, done + MAX_TOKENS_PER_STEP)
                yield done
                if done < due:
                    # Behind schedule (decode_ms 0, or a busy loop): let other requests run too.
                    await asyncio.sleep(0)
                continue
            await asyncio.sleep(max(start + (done + 1) * decode_s - loop.time(), MIN_SLEEP_S))


async def _mark_simulated(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Every answer says it comes from a simulator, not a real engine."""
    response.headers[SIMULATED_HEADER] = "1"


async def _write_paced(response: web.StreamResponse, pieces: list[bytes], pace_s: float, first: bool) -> None:
    """Write each of ``pieces`` on its own, ``pace_s`` seconds apart (and after the previous
    write, unless ``first``): a slow engine."""
    for piece in pieces:
        if not first:
            await asyncio.sleep(pace_s)
        first = False
        await response.write(piece)


async def _abort(request: web.BaseRequest) -> None:
    """Abort the connection as a crashing engine would: no further byte, no clean end.

    ``abort()`` drops what the transport still buffers, so the bytes already written are let out
    first: a client must see the chunks sent so far, then the broken connection.
    """
    transport = request.transport
    if transport is None:
        return
    # No transport event says "buffer empty" (resume_writing fires at the low-water mark), hence
    # the poll; it ends when the client reads or leaves.
    while transport.get_write_buffer_size() > 0 and not transport.is_closing():  # noqa: ASYNC110
        await asyncio.sleep(MIN_SLEEP_S)
    transport.abort()


async def _send_first(
    response: web.StreamResponse, events: AsyncGenerator[list[bytes], None], count: int
) -> None:
    """Write the first ``count`` events of ``events`` (never ``[DONE]``), then close the generator."""
    written = 0
    async with aclosing(events):
        async for batch in events:
            if written >= count:
                break
            batch = [event for event in batch if event != wire.SSE_DONE][: count - written]
            await response.write(b"".join(batch))
            written += len(batch)


def _keep(kept: OrderedDict[str, _T], key: str, value: _T) -> None:
    """Remember ``value`` under ``key``, forgetting the oldest beyond ``SENT_KEPT`` entries."""
    kept[key] = value
    while len(kept) > SENT_KEPT:
        kept.popitem(last=False)


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

    async def close(self) -> None:
        """Stop listening and end every request in flight (their clients see the stream cut)."""
        await self.runner.cleanup()


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
