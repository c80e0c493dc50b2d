"""How the simulated engine writes an answer's bytes, and how it breaks off: events in one write
each batch or paced one by one (a slow engine, :class:`~.faults.Slow`), the first few events then
an aborted connection (:class:`~.faults.DieMidStream`) or an error event
(:class:`~.faults.ErrorMidStream`). The routes that decide what to write are :mod:`.server`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing

from aiohttp import web

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.dialects import Writer
from luftpause.testkit.engine.faults import ErrorMidStream
from luftpause.testkit.engine.slotted import MIN_SLEEP_S

__all__ = ["abort", "send_events", "send_first", "send_then_die", "send_then_error", "write_paced"]


async def send_events(
    response: web.StreamResponse, events: AsyncGenerator[list[bytes], None], pace_s: float
) -> bytes:
    """Write ``events``: each list in one write, or with ``pace_s`` > 0 (seconds) each event
    in its own write, ``pace_s`` apart. Returns every byte written, for ``GET /testkit/sent``."""
    sent = bytearray()
    async with aclosing(events):
        async for batch in events:
            if pace_s > 0:
                await write_paced(response, batch, pace_s, first=not sent)
                sent += b"".join(batch)
                continue
            data = b"".join(batch)
            sent += data
            await response.write(data)
    return bytes(sent)


async def send_then_die(
    request: web.Request,
    response: web.StreamResponse,
    events: AsyncGenerator[list[bytes], None],
    after_chunks: int,
) -> None:
    """Write the first ``after_chunks`` events (never ``[DONE]``), then abort the connection."""
    await send_first(response, events, after_chunks)
    await abort(request)


async def send_then_error(
    response: web.StreamResponse,
    events: AsyncGenerator[list[bytes], None],
    fault: ErrorMidStream,
    writer: Writer,
) -> None:
    """Write the first ``after_chunks`` events, then the error event (chat: and ``[DONE]``)."""
    await send_first(response, events, fault.after_chunks)
    await response.write(writer.failure(fault.message))


async def write_paced(response: web.StreamResponse, pieces: list[bytes], pace_s: float, first: bool) -> None:
    """Write each of ``pieces`` on its own, ``pace_s`` seconds apart (and after the previous
    write, unless ``first``): a slow engine."""
    for piece in pieces:
        if not first:
            await asyncio.sleep(pace_s)
        first = False
        await response.write(piece)


async def abort(request: web.BaseRequest) -> None:
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


async def send_first(
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
