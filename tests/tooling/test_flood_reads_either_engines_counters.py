"""``bench/flood.py``'s engine counters (review item 12): the prefix cache and retractions read from
SGLang's names or vLLM's, as the simulator's step model shows either on ``/metrics``, summed over
the engines, an engine showing both counted once, and a figure no engine showed reported unknown
(``None``), not 0. Real simulated engines on loopback, asked by the ``openai`` client."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp import web
from repo_paths import DATA, ROOT

from luftpause.testkit.engine import RunningEngine
from luftpause.testkit.launch.procs import free_port

sys.path.insert(0, str(ROOT / "bench"))

from flood_passes import engine_counters, row_of

pytestmark = pytest.mark.anyio

Factory = Callable[..., Awaitable[RunningEngine]]
MODEL = "llama-3.2-1b"
SYSTEM: Any = {"role": "system", "content": "You are a careful research assistant. " * 40}


async def _two_turns_of_one_run(engine: RunningEngine) -> tuple[int, int]:
    """Two turns sharing the system prompt: (prompt tokens, cached prompt tokens) the client saw."""
    client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0)
    prompt = cached = 0
    for question in ("first question", "and then?"):
        answer = await client.chat.completions.create(
            model=MODEL, messages=[SYSTEM, {"role": "user", "content": question}], max_tokens=8
        )
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        prompt += answer.usage.prompt_tokens
        cached += answer.usage.prompt_tokens_details.cached_tokens or 0
    await client.close()
    return prompt, cached


@pytest.mark.parametrize(
    ("profile", "metrics"),
    [
        ("sglang-llama-3.2-1b-fp8-8gb", "sglang"),
        ("vllm-llama-3.2-1b-fp8-8gb", "vllm"),
        ("vllm-llama-3.2-1b-fp8-8gb", "both"),
    ],
)
async def test_the_counters_are_read_in_either_naming_and_summed_over_the_engines(
    make_engine: Factory, profile: str, metrics: str
) -> None:
    engines = [
        await make_engine(profile=profile, metrics=metrics, time_scale=0.01, tool_rounds=0) for _ in "ab"
    ]
    seen = [await _two_turns_of_one_run(engine) for engine in engines]
    counters = await asyncio.to_thread(engine_counters, [engine.url for engine in engines])
    prompt, cached = sum(p for p, _ in seen), sum(c for _, c in seen)
    assert cached > 0  # the second turn of each found its system prompt
    assert counters == {"promptTokens": prompt, "cachedTokens": cached, "retractions": 0.0}
    row = row_of({"groups": [_group()], "engines": counters})
    assert (row["engineCacheHitRate"], row["retractions"]) == (round(cached / prompt, 4), 0)


async def test_a_figure_no_engine_shows_is_unknown_not_zero() -> None:
    """A real llama-server's ``/metrics`` (tests/data/README.md) has none of these names."""
    page = (DATA / "llamacpp_metrics_loaded.txt").read_text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        counters = await asyncio.to_thread(engine_counters, [f"http://127.0.0.1:{port}"])
    finally:
        await runner.cleanup()
    assert counters == {"promptTokens": None, "cachedTokens": None, "retractions": None}
    row = row_of({"groups": [_group()], "engines": counters})
    assert (row["engineCacheHitRate"], row["retractions"]) == (None, None)


def _group() -> dict[str, Any]:
    """A pass's one group, as :func:`flood_passes.row_of` reads it (its figures beside the point here)."""
    return {
        "class": "interactive",
        "runsPerMinute": 1.0,
        "runTimeP50": 1.0,
        "promptTokens": 0,
        "cacheHitRate": None,
        "failed": 0,
    }
