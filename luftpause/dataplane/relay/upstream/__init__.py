"""The dataplane's HTTP/1.1 client to engines: one keep-alive pool per replica.

Why not aiohttp's client: a relay needs a small part of it (send one request, read a status, headers
and a body as it arrives), and its full stack cost about twice the CPU per turn of this module,
measured in one run through a bare granian relay (bench/README.md, "End to end": 0.39 against 0.23
ms per turn at one stream; a Rust client, ``pyreqwest``, 0.28).

What it is: an :class:`asyncio.Protocol` per connection with httptools' response parser (llhttp,
the parser of Node.js), which undoes chunked framing; the body is handed to the relay as it
arrives, everything one read brought joined into one piece.

Contract:

* :meth:`EnginePool.send` writes one request (``POST``, HTTP/1.1, ``Host``, ``Content-Length``,
  the pool's fixed headers and the turn's own) on an idle kept-alive connection, or a new one
  (``ENGINE_CONNECT_TIMEOUT_S`` to connect), and returns once the response's head has come:
  ``status``, ``headers`` (lower-case names, raw values, in order).
* :meth:`EngineExchange.read` returns the body as it comes: every byte received since the last call
  in one ``bytes``, waiting when none is there; ``b""`` once the body has ended.
  :meth:`EngineExchange.take` is its non-waiting half.
* Bounded: at most ``HIGH_WATER_BYTES`` of body wait in the exchange; past that the connection stops
  reading (TCP then stops the engine) until the relay has taken them. A relay that waits on a slow
  client therefore holds the engine back, never memory.
* Timeouts: ``read_timeout_s`` (seconds) bounds how long the relay waits for a head or a body byte
  with nothing arriving (the time it spends sending to a slow client does not count); checked
  every ``min(1, read_timeout_s / 4)`` seconds by one task per :class:`Upstream`.
* Ends: :meth:`EngineExchange.release` after the body ended returns the connection to its pool
  when the engine keeps it alive; :meth:`EngineExchange.abort` (the client left, the relay failed)
  resets the connection, which the engine sees at once (SGLang and vLLM abort the request then).
  An exchange whose relay set ``answered`` (the answer's last event came, the body's end has not:
  an engine writes its chunked terminator after its last event, maybe a loop turn or more later)
  is released without waiting: the connection goes back to its pool if the body's end arrives
  within ``BODY_END_GRACE_S`` (anything else still arriving is dropped unread), and is reset
  otherwise.
* Bounded idle: at most ``max_idle`` idle connections per pool (the replica's ``max_inflight``,
  as the relay builds its pools; ``DEFAULT_MAX_IDLE`` otherwise); a connection released past
  that is closed, never kept.

Kept-alive connections and the engine's own idle close. An engine closes a connection it has kept
idle for a while (uvicorn, under SGLang and vLLM: 5 s after it finished writing; cpp-httplib,
under llama-server: 5 s likewise), and its close can cross a request already on its way. So:

* an idle connection is kept ``KEEPALIVE_S`` from the arrival of its answer's last byte (the
  engine's clock starts when it wrote that byte, not when the relay let the connection go);
* one taken from the pool is checked first: found closed (its socket readable: the engine's end of
  stream, or bytes nobody asked for, arrived and the loop has not read them yet) it is dropped
  and the next taken, as urllib3 (``is_connection_dropped``) and httpcore (``has_expired``) do;
  bytes arriving on an idle connection close it likewise;
* a request sent on a kept-alive connection that then ends (reset or end of stream) before a
  single byte of its answer arrived, within ``RESEND_WINDOW_S`` of its write, is sent once more,
  on a new connection; ``EnginePool.resent`` counts these and each is logged. Never otherwise: a
  close later than that (an engine that crashed mid-generation, a load balancer closing a quiet
  connection: a whole answer's work would be done twice), a new connection's failure, any failure
  after a byte of the answer (the relay may have passed it on: the client's connection is aborted,
  as the failure contract says), a timeout or a protocol error are the turn's failure.

Re-sending a ``POST``: urllib3 re-sends after a read error only the methods its ``Retry`` allows
(idempotent ones), aiohttp only idempotent ones on a kept-alive connection (``IDEMPOTENT_METHODS``,
after RFC 9112 section 9.3.1), httpcore never once the request is written. RFC 9112 section 9.3.1
allows a non-idempotent request to be retried when the client knows its semantics are idempotent.
An engine's completion (chat, messages, responses, classify) changes nothing but its caches, and
an engine whose idle close crossed a request closed the connection before it could work on it
(the close lands within milliseconds of the write; ``RESEND_WINDOW_S`` bounds it), so the worst a
re-send costs is the prompt read twice. A close that comes later may end a generation under way
(a non-streamed answer sends no byte before it is whole), which is never sent again.

Errors: every failure is an :class:`EngineError` (``luftpause.dataplane.errors``, where a front
door's translation raises it too; the message says what happened):
``EngineConnectError`` (no connection), ``EngineClosed`` (the engine closed or reset the connection
before its answer ended), ``EngineTimeout`` (the read timeout passed), ``EngineProtocolError`` (not
HTTP/1.1 as the parser reads it).
"""

from luftpause.dataplane.errors import EngineError
from luftpause.dataplane.relay.upstream.connection import (
    BODY_END_GRACE_S,
    DEFAULT_MAX_IDLE,
    ENGINE_CONNECT_TIMEOUT_S,
    HIGH_WATER_BYTES,
    KEEPALIVE_S,
    RESEND_WINDOW_S,
    EngineClosed,
    EngineConnectError,
    EngineExchange,
    EngineProtocolError,
    EngineTimeout,
)
from luftpause.dataplane.relay.upstream.pool import EnginePool, Upstream

__all__ = [
    "BODY_END_GRACE_S",
    "DEFAULT_MAX_IDLE",
    "ENGINE_CONNECT_TIMEOUT_S",
    "HIGH_WATER_BYTES",
    "KEEPALIVE_S",
    "RESEND_WINDOW_S",
    "EngineClosed",
    "EngineConnectError",
    "EngineError",
    "EngineExchange",
    "EnginePool",
    "EngineProtocolError",
    "EngineTimeout",
    "Upstream",
]
