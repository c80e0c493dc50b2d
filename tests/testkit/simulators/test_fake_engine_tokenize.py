"""The simulator's ``POST /tokenize`` (vLLM's shape) counts a prompt as its completions do, and with
``stream_options.continuous_usage_stats`` its first chunk says the prompt's tokens, as vLLM's does:
what the dataplane's ``count_tokens`` and ``message_start`` read."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from luftpause.testkit.engine import RunningEngine

pytestmark = pytest.mark.anyio

MODEL = "llama-3.2-1b"
Factory = Callable[..., Awaitable[RunningEngine]]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "count " * 60}]


async def test_tokenize_counts_what_the_completion_reports(make_engine: Factory) -> None:
    engine = await make_engine(prefill_ms_per_1k=0.0, decode_ms=0.0)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{engine.url}/tokenize", json={"model": MODEL, "messages": MESSAGES}) as answer:
            counted = await answer.json()
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        async with http.post(f"{engine.url}/v1/chat/completions", json=body) as answer:
            events = [
                json.loads(line[6:])
                for line in (await answer.text()).splitlines()
                if line.startswith("data: {")
            ]
        async with http.post(f"{engine.url}/tokenize", json={"model": "nope", "prompt": "x"}) as answer:
            unknown = answer.status
    assert counted["count"] == len(counted["tokens"]) > 10
    first, last = events[0], events[-1]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert first["usage"]["prompt_tokens"] == counted["count"] == last["usage"]["prompt_tokens"]
    assert first["usage"]["completion_tokens"] == 0
    assert unknown == 404
