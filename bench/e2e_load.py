"""The load of the end-to-end overhead benchmark: closed-loop streams of turns through one
arrangement, each turn's time to first token (seconds), and its failures as text.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson

from luftpause.config import DEFAULT_MODEL


class TurnFailed(Exception):
    """A turn that did not end as a complete 200 answer with content; the message says how."""


def _first_content_at(buffer: bytes, start: int) -> tuple[bool, int]:
    """Whether a complete SSE event in ``buffer[start:]`` has a delta with non-empty content, and
    the offset after the last complete event looked at (the engines end events with a blank line)."""
    while True:
        end = buffer.find(b"\n\n", start)
        if end < 0:
            return False, start
        for line in buffer[start:end].split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                for choice in orjson.loads(line[5:]).get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        return True, end + 2
        start = end + 2


async def one_turn(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], stream: bool
) -> float:
    """Send one turn and read it to the end; its time to first token in seconds. ``TurnFailed`` when
    the answer is not 200, has no content, or (streamed) does not end with ``data: [DONE]``."""
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            raise TurnFailed(f"status {response.status}: {(await response.read())[:200]!r}")
        if not stream:
            payload = await response.read()
            first = time.perf_counter() - started
            if not orjson.loads(payload)["choices"][0]["message"]["content"]:
                raise TurnFailed(f"no content: {payload[:200]!r}")
            return first
        ttft: float | None = None
        buffer, scanned, tail = b"", 0, b""
        async for data in response.content.iter_any():
            if ttft is None:
                buffer += data
                found, scanned = _first_content_at(buffer, scanned)
                if found:
                    ttft = time.perf_counter() - started
                    buffer = b""
            tail = (tail + data)[-64:]
        if ttft is None:
            raise TurnFailed("the stream carried no content")
        if not tail.rstrip().endswith(b"data: [DONE]"):
            raise TurnFailed(f"the stream did not end with [DONE]: {tail!r}")
        return ttft


@dataclass
class LoadResult:
    """One closed-loop run: ``ttfts`` (seconds, one per completed turn), ``errors`` (their texts),
    ``seconds`` of wall time."""

    ttfts: list[float]
    errors: list[str]
    seconds: float


async def closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    streams: int,
    turns: int,
    stream: bool,
    max_tokens: int,
    tag: str,
) -> LoadResult:
    """``turns`` turns over ``streams`` concurrent streams, each sending its next turn when its last
    one ended; each stream is one run (``x-luftpause-run-id: <tag>-<i>``, sent to every arrangement)."""
    body = orjson.dumps(
        {
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "Say something short."}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )
    endpoint = f"{url}/v1/chat/completions"
    remaining = turns
    ttfts: list[float] = []
    errors: list[str] = []

    async def one_stream(index: int) -> None:
        nonlocal remaining
        headers = {"content-type": "application/json", "x-luftpause-run-id": f"{tag}-{index}"}
        while remaining > 0:
            remaining -= 1
            try:
                ttfts.append(await one_turn(session, endpoint, body, headers, stream))
            except (TurnFailed, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    await asyncio.gather(*(one_stream(i) for i in range(streams)))
    return LoadResult(ttfts, errors, time.perf_counter() - started)
