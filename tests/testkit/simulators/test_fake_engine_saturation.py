"""The engine simulator's model of a saturated engine: batching and its queue, priority, decode
slowing with the batch, the prefix cache (hits, moves, LRU eviction), both metric namings, the
time scale, and the simulated marks the SGLang router's worker endpoints carry.

Durations are asserted on the simulator's computed costs (``GET /testkit/cost/{id}``), never on
wall time.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from luftpause.testkit.engine import EngineSettings, RunningEngine
from luftpause.testkit.engine.costs import CostModel, message_tokens
from luftpause.testkit.engine.prefix_cache import PrefixCache, prefix_path
from luftpause.testkit.engine.scheduling import EngineStats, SlotPool
from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.anyio

MODEL = "llama-3.2-1b"
SYSTEM = {"role": "system", "content": "You are a careful research assistant."}

Factory = Callable[..., Awaitable[RunningEngine]]

LOOKUP_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


@pytest.fixture
def make_engine(make_engine: Factory) -> Factory:
    """conftest's factory, 100 times faster than the settings say unless told otherwise."""

    def make(**settings: Any) -> Awaitable[RunningEngine]:
        return make_engine(**{"time_scale": 0.01, **settings})

    return make


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": text}], **extra}


async def post(session: aiohttp.ClientSession, engine: RunningEngine, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(engine.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
    return answer


async def cost(session: aiohttp.ClientSession, engine: RunningEngine, completion_id: str) -> dict[str, Any]:
    async with session.get(f"{engine.url}/testkit/cost/{completion_id}") as resp:
        assert resp.status == 200
        result: dict[str, Any] = await resp.json()
    return result


async def samples(session: aiohttp.ClientSession, engine: RunningEngine) -> dict[str, float]:
    """Every sample of ``/metrics`` for MODEL, by sample name (counters as ``..._total``)."""
    async with session.get(engine.url + "/metrics") as resp:
        text = await resp.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model_name") == MODEL
    }


async def wait_until(check: Callable[[], bool]) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the engine never got there")


async def endless(session: aiohttp.ClientSession, engine: RunningEngine, text: str) -> aiohttp.ClientResponse:
    """A streamed request that decodes until its client leaves; returns once it holds a slot."""
    body = chat(text, stream=True, max_tokens=10**7)
    resp = await session.post(engine.url + "/v1/chat/completions", json=body)
    await resp.content.readuntil(b"\n\n")
    return resp


# --- batching and the queue ----------------------------------------------------------------------


@pytest.mark.parametrize("naming", ["sglang", "vllm"])
async def test_the_request_beyond_the_slots_waits_and_metrics_show_it(
    make_engine: Factory, naming: str
) -> None:
    engine = await make_engine(slots=2, metrics=naming)
    running, waiting = {
        "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    }[naming]
    async with aiohttp.ClientSession() as session:
        hogs = [await endless(session, engine, f"hog {i}") for i in range(2)]
        third = asyncio.create_task(post(session, engine, chat("third", max_tokens=3)))
        await wait_until(lambda: engine.stats.waiting == 1)
        busy = await samples(session, engine)
        assert not third.done()
        for hog in hogs:
            hog.close()
        answer = await third
        idle = await samples(session, engine)
    assert (busy[running], busy[waiting]) == (2, 1)
    assert (idle[running], idle[waiting]) == (0, 0)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert engine.stats.max_running_seen == 2


@pytest.mark.parametrize(
    ("order", "first"), [("lower_first", "urgent"), ("higher_first", "relaxed"), ("fcfs", "relaxed")]
)
async def test_the_queue_follows_priority_when_set(make_engine: Factory, order: str, first: str) -> None:
    engine = await make_engine(slots=1, priority_order=order)
    finished: list[str] = []

    async def ask(session: aiohttp.ClientSession, name: str, priority: int) -> None:
        await post(session, engine, chat(name, max_tokens=2, priority=priority))
        finished.append(name)

    async with aiohttp.ClientSession() as session:
        hog = await endless(session, engine, "hog")
        relaxed = asyncio.create_task(ask(session, "relaxed", 5))
        await wait_until(lambda: engine.stats.waiting == 1)
        urgent = asyncio.create_task(ask(session, "urgent", 1))
        await wait_until(lambda: engine.stats.waiting == 2)
        hog.close()
        await asyncio.gather(relaxed, urgent)
    assert finished[0] == first


async def test_slot_pool_orders_waiters_by_rank_then_arrival() -> None:
    stats = EngineStats()
    pool = SlotPool(1, stats)
    release = asyncio.Event()
    order: list[str] = []

    async def hold(name: str, rank: int) -> None:
        async with pool.slot(rank):
            order.append(name)
            if name == "holder":
                await release.wait()

    tasks = [asyncio.create_task(hold("holder", 0))]
    await asyncio.sleep(0)
    for name, rank in [("b1", 2), ("a1", 1), ("b2", 2), ("a2", 1)]:
        tasks.append(asyncio.create_task(hold(name, rank)))
        await asyncio.sleep(0)
    assert stats.waiting == 4
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["holder", "a1", "a2", "b1", "b2"]


# --- costs: decode slows with the batch, the time scale -------------------------------------------


def test_decode_step_grows_with_the_running_batch_and_shrinks_with_the_time_scale() -> None:
    costs = CostModel(EngineSettings(decode_ms=10.0, batch_slowdown=0.25, prefill_ms_per_1k=100.0))
    assert costs.decode_seconds(1) == pytest.approx(0.010)
    assert costs.decode_seconds(3) == pytest.approx(0.015)
    assert costs.prefill_seconds(2000) == pytest.approx(0.2)
    scaled = CostModel(
        EngineSettings(decode_ms=10.0, batch_slowdown=0.25, prefill_ms_per_1k=100.0, time_scale=0.1)
    )
    assert scaled.decode_seconds(3) == pytest.approx(0.0015)
    assert scaled.prefill_seconds(2000) == pytest.approx(0.02)


async def test_a_request_decoding_beside_another_costs_more_per_token(make_engine: Factory) -> None:
    engine = await make_engine(slots=2, decode_ms=100.0, batch_slowdown=0.5, time_scale=0.01)
    async with aiohttp.ClientSession() as session:
        hog = await endless(session, engine, "hog")
        beside = await post(session, engine, chat("beside", max_tokens=10))
        hog.close()
        await wait_until(lambda: engine.stats.running == 0)
        alone = await post(session, engine, chat("alone", max_tokens=10))
        beside_cost = await cost(session, engine, beside["id"])
        alone_cost = await cost(session, engine, alone["id"])
    # 100 ms x 0.01 per token alone; 1.5 x that with one other request running.
    assert alone_cost["decode_s"] == pytest.approx(10 * 0.001)
    assert beside_cost["decode_s"] == pytest.approx(10 * 0.0015)
    assert alone_cost["completion_tokens"] == beside_cost["completion_tokens"] == 10


# --- the prefix cache ----------------------------------------------------------------------------


async def two_turns(
    session: aiohttp.ClientSession, first: RunningEngine, second: RunningEngine
) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """A run's first turn (a tool call) on ``first`` and its second turn on ``second``."""
    opening = chat("find the latest figures", tools=[LOOKUP_TOOL])
    turn1 = await post(session, first, opening)
    message = turn1["choices"][0]["message"]
    assert message["tool_calls"], "the first turn must be a tool round"
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "42 units in March"}
    messages = [*opening["messages"], message, result]
    turn2 = await post(session, second, {**opening, "messages": messages})
    return turn1, turn2, messages


async def test_a_run_s_next_turn_hits_the_cache_on_its_replica_and_misses_after_moving(
    make_engine: Factory,
) -> None:
    home = await make_engine(metrics="both", prefill_ms_per_1k=1000.0)
    other = await make_engine(metrics="both", prefill_ms_per_1k=1000.0)
    async with aiohttp.ClientSession() as session:
        turn1, turn2, messages = await two_turns(session, home, home)
        _, moved, _ = await two_turns(session, home, other)
        turn2_cost = await cost(session, home, turn2["id"])
        home_metrics = await samples(session, home)
    assert turn1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # Everything but the new tool result: the prompt and the reply, cached as the turn ended.
    expected = sum(message_tokens(m) for m in messages[:-1])
    assert turn2["usage"]["prompt_tokens"] == expected + message_tokens(messages[-1])
    assert turn2["usage"]["prompt_tokens_details"] == {"cached_tokens": expected}
    assert moved["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # Prefill is paid on the uncached tokens only: 1 s per 1,000 tokens x time scale 0.01.
    assert turn2_cost["prefill_s"] == pytest.approx(message_tokens(messages[-1]) / 1000 * 0.01)
    assert home.stats.cached_tokens > 0 and other.stats.cached_tokens == 0
    hits = home_metrics["vllm:prefix_cache_hits_total"]
    queries = home_metrics["vllm:prefix_cache_queries_total"]
    assert hits == home.stats.cached_tokens  # every lookup on "home" was a completed request
    assert queries == home.stats.prompt_tokens
    assert home_metrics["sglang:cache_hit_rate"] == pytest.approx(hits / queries)


async def test_a_flood_of_distinct_prompts_evicts_an_idle_run_s_prefix(make_engine: Factory) -> None:
    # Room for a few prompts: the run's prefix, then the flood pushes it out, least recent first.
    flooded = await make_engine(cache_tokens=300)
    spared = await make_engine(cache_tokens=300)
    async with aiohttp.ClientSession() as session:
        opening = chat("find the latest figures", tools=[LOOKUP_TOOL])
        for engine in (flooded, spared):
            await post(session, engine, opening)
        for i in range(20):
            await post(session, flooded, chat(f"batch item {i}: " + "data " * 40, max_tokens=2))
        answers = []
        for engine in (flooded, spared):
            # The same prompt again (not even a new turn): what is left of it in the cache.
            answers.append(await post(session, engine, opening))
    flooded_hit, spared_hit = (a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers)
    # The system message is shared with every flood prompt, so it stays; the run's own is gone.
    assert flooded_hit == message_tokens(SYSTEM)
    assert spared_hit == answers[1]["usage"]["prompt_tokens"] - 1  # all but the one token computed
    assert flooded.cache.evicted > 0 and flooded.cache.used <= 300


def test_the_cache_evicts_leaves_before_the_prefixes_they_extend() -> None:
    cache = PrefixCache(capacity=30)
    shared = {"role": "system", "content": "s" * 40}  # 10 tokens
    run_a = prefix_path(MODEL, [shared, {"role": "user", "content": "a" * 40}])
    run_b = prefix_path(MODEL, [shared, {"role": "user", "content": "b" * 40}])
    run_c = prefix_path(MODEL, [shared, {"role": "user", "content": "c" * 40}])
    cache.insert(run_a)
    cache.insert(run_b)
    assert cache.used == 30
    cache.insert(run_c)  # evicts run_a's leaf, never the shared system node
    assert cache.used == 30 and cache.evicted == 10
    assert cache.lookup(run_a, prompt_tokens=20) == 10
    assert cache.lookup(run_b, prompt_tokens=21) == 20
    assert cache.lookup(run_c, prompt_tokens=20) == 19  # never the whole prompt
    assert (cache.queries, cache.hits) == (61, 49)
    assert prefix_path("another-model", [shared]).nodes[0][0] not in cache


# --- metrics -------------------------------------------------------------------------------------


async def test_both_metric_namings_parse_with_prometheus_client(make_engine: Factory) -> None:
    engine = await make_engine(metrics="both")
    async with aiohttp.ClientSession() as session:
        await post(session, engine, chat("hello"))
        async with session.get(engine.url + "/metrics") as resp:
            text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert families[name].type == "gauge", name
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        assert families[name].type == "counter", name
    queries = [s for s in families["vllm:prefix_cache_queries"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in queries] == [
        ({"model_name": MODEL, "engine": "0"}, engine.stats.prompt_tokens)
    ]


async def test_one_naming_leaves_the_other_out(make_engine: Factory) -> None:
    engine = await make_engine(metrics="vllm")
    async with aiohttp.ClientSession() as session, session.get(engine.url + "/metrics") as resp:
        text = await resp.text()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "vllm:num_requests_waiting" in names
    assert not any(name.startswith("sglang:") for name in names)


# --- logprobs for label scoring ------------------------------------------------------------------


async def test_first_token_logprobs_are_the_same_for_the_same_prompt_on_any_replica(
    make_engine: Factory,
) -> None:
    engines = [await make_engine(), await make_engine()]
    prompt = "Label this ticket as billing, outage or question: my invoice is wrong"
    tops = []
    for engine in engines:
        async with openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0) as client:
            for text in (prompt, prompt + "!"):
                answer = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": text}],
                    max_tokens=1,
                    logprobs=True,
                    top_logprobs=10,
                )
                content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
                assert content is not None and len(content) == 1
                tops.append([(t.token, t.logprob) for t in content[0].top_logprobs])
    assert tops[0] == tops[2] and tops[1] == tops[3]
    assert tops[0] != tops[1], "a different prompt scores differently"
    assert {"billing", "outage", "question"} <= {token for token, _ in tops[0]}
    assert sum(math.exp(lp) for _, lp in tops[0]) <= 1.0


# --- what SGLang's router asks of a worker, and the simulated marks ------------------------------


async def test_router_endpoints_answer_and_say_simulated(make_engine: Factory) -> None:
    engine = await make_engine(slots=3, metrics="vllm", time_scale=0.5)
    async with aiohttp.ClientSession() as session:
        for path in ("/server_info", "/get_server_info"):
            async with session.get(engine.url + path) as resp:
                info = await resp.json()
                assert resp.headers["x-luftpause-simulated"] == "1"
            assert info["simulated"] is True and info["version"] == "luftpause-simulator"
            assert info["max_running_requests"] == 3
            assert info["simulator"]["time_scale"] == 0.5 and info["simulator"]["metrics"] == "vllm"
        for path in ("/model_info", "/get_model_info"):
            async with session.get(engine.url + path) as resp:
                assert (await resp.json()) == {
                    "model_path": MODEL,
                    "tokenizer_path": MODEL,
                    "is_generation": True,
                    "simulated": True,
                }
        for path in ("/health", "/v1/models", "/metrics"):
            async with session.get(engine.url + path) as resp:
                assert resp.status == 200 and resp.headers["x-luftpause-simulated"] == "1"
        answer = await post(session, engine, chat("hi"))
    assert answer["system_fingerprint"] == "luftpause-simulator"


def test_real_process_takes_the_model_flags(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["fake-engine", "--port", str(port), "--time-scale", "0.001", "--decode-ms", "1000"]
    argv += ["--metrics", "vllm", "--priority", "lower_first", "--cache-tokens", "0", "--batch-slowdown", "0"]
    child = ChildProcess("fake-engine", argv, log_path=tmp_path / "engine.log", ready_url=url + "/health")
    child.start()
    try:
        child.wait_ready()
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            messages: Any = [SYSTEM, {"role": "user", "content": "twice"}]
            for _ in range(2):
                answer = client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=5, extra_body={"priority": 3}
                )
                assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
                assert answer.usage.prompt_tokens_details.cached_tokens == 0  # --cache-tokens 0: no cache
        info = client_get_json(url + "/server_info")
        assert info["simulator"]["time_scale"] == 0.001 and info["schedule_policy"] == "lower_first"
        spent = client_get_json(f"{url}/testkit/cost/{answer.id}")
        assert spent["decode_s"] == pytest.approx(5 * 1.0 * 0.001)
    finally:
        child.stop()
    assert child.poll() == 0


def client_get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())
