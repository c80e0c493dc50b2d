"""``luftpause fake-engine --profile NAME``: the step model behind the HTTP engine, used as a
client uses it (openai and aiohttp on loopback, and one real process).

Durations are asserted on the simulator's computed costs (``GET /testkit/cost/{id}``) and the
model's own figures, never on wall time.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from luftpause.testkit.engine import EngineSettings, RunningEngine
from luftpause.testkit.engine.model import PROFILES, EngineModel, EngineRequest
from luftpause.testkit.engine.prefix_cache import prefix_path
from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.anyio

MODEL = "llama-3.2-1b"
SYSTEM: Any = {"role": "system", "content": "You are a careful research assistant. " * 40}
SGLANG = "sglang-llama-3.2-1b-fp8-8gb"
VLLM = "vllm-llama-3.2-1b-fp8-8gb"

Factory = Callable[..., Awaitable[RunningEngine]]


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": text}], **extra}


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


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def stream_text(
    session: aiohttp.ClientSession, engine: RunningEngine, body: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A streamed completion's content and its usage."""
    async with session.post(
        engine.url + "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as resp:
        assert resp.status == 200, await resp.text()
        text, usage = "", {}
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
    return text, usage


async def wait_until(check: Callable[[], bool]) -> None:
    for _ in range(4000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the engine never got there")


@pytest.mark.parametrize("profile", [SGLANG, VLLM, "llamacpp-smollm2-135m-cpu"])
async def test_a_run_streams_its_turns_and_the_next_turn_finds_its_prefix_in_the_pool(
    make_engine: Factory, profile: str
) -> None:
    engine = await make_engine(profile=profile, time_scale=0.01, tool_rounds=0)
    client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0)
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "first question"}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20)
    assert first.usage is not None and first.usage.completion_tokens == 20
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    messages += [{"role": "assistant", "content": first.choices[0].message.content}]
    messages += [{"role": "user", "content": "and then?"}]
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=30, stream=True, stream_options={"include_usage": True}
    )
    pieces, usage = [], None
    async for chunk in chunks:
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 30
    # The system prompt, the question and the reply were cached when the first turn finished.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 3  # "and then?"
    assert "".join(pieces)
    await client.close()


async def test_the_http_engine_costs_what_the_model_computes(make_engine: Factory) -> None:
    engine = await make_engine(profile=SGLANG, time_scale=0.01)
    async with aiohttp.ClientSession() as session:
        answer = await (
            await session.post(engine.url + "/v1/chat/completions", json=chat("hi", max_tokens=40))
        ).json()
        spent = await get_json(session, f"{engine.url}/testkit/cost/{answer['id']}")
    model = EngineModel(PROFILES[SGLANG], time_scale=0.01)
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    model.submit(EngineRequest("r", prefix_path(MODEL, messages), 40), 0.0)
    times = []
    while (moment := model.next_event_time()) is not None:
        times += [e.time for e in model.advance(moment)]
    assert spent["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert spent["prefill_s"] + spent["decode_s"] == pytest.approx(times[-1])


@pytest.mark.parametrize(
    ("profile", "counter"),
    [(SGLANG, "sglang:num_retracted_requests_total"), (VLLM, "vllm:num_preemptions_total")],
)
async def test_a_full_pool_retracts_streams_and_every_stream_still_ends_whole(
    make_engine: Factory, profile: str, counter: str
) -> None:
    # A long stream decodes 700 steps first: SGLang's new-token ratio decays from 0.7 to its floor
    # (0.098) meanwhile, so that it then admits more than fits as requests grow, as in a long
    # flood. Then 6 streams sharing its ~380-token system prompt ask for 500 tokens each in a
    # 3,500-token pool: the engine retracts (SGLang) or preempts (vLLM) and recomputes, and each
    # client still gets its 500 tokens.
    engine = await make_engine(profile=profile, pool_tokens=3500, time_scale=0.05, metrics="both")
    model = engine.engine.engine_model
    assert model is not None
    async with aiohttp.ClientSession() as session:
        long = asyncio.create_task(stream_text(session, engine, chat("long", max_tokens=2500)))
        await wait_until(lambda: model.load().generated_tokens_total >= 700)
        results = await asyncio.gather(
            *(stream_text(session, engine, chat(f"question {i}", max_tokens=500)) for i in range(6))
        )
        await long
        metrics = await samples(session, engine)
    for text, usage in results:
        assert usage["completion_tokens"] == 500
        assert text
    assert metrics[counter] > 0, model.load()
    name = "sglang:token_usage" if profile == SGLANG else "vllm:kv_cache_usage_perc"
    assert metrics[name] == 0.0  # all done: only the (evictable) prefix cache is left


async def test_metrics_show_the_pool_filling_and_emptying_when_the_client_leaves(
    make_engine: Factory,
) -> None:
    engine = await make_engine(profile=SGLANG, pool_tokens=20_000, time_scale=0.05, metrics="both")
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            engine.url + "/v1/chat/completions", json=chat("endless", stream=True, max_tokens=15_000)
        )
        await resp.content.readuntil(b"\n\n")
        await resp.content.readuntil(b"\n\n")
        busy = await samples(session, engine)
        resp.close()
        await wait_until(lambda: engine.stats.running == 0)
        idle = await samples(session, engine)
    assert busy["sglang:num_running_reqs"] == 1 and busy["vllm:num_requests_running"] == 1
    assert 0 < busy["sglang:token_usage"] == busy["vllm:kv_cache_usage_perc"] < 1
    assert idle["sglang:token_usage"] == 0.0  # freed at once; its prompt stays cached, evictable
    assert idle["sglang:num_running_reqs"] == 0
    assert idle["vllm:prompt_tokens_total"] == busy["vllm:prompt_tokens_total"] > 0
    model = engine.engine.engine_model
    assert model is not None and model.load().evictable_tokens > 0


async def test_a_request_larger_than_the_pool_is_refused_with_400(make_engine: Factory) -> None:
    engine = await make_engine(profile=VLLM, pool_tokens=1000)
    client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"needs .* tokens of KV"):
        await client.chat.completions.create(model=MODEL, messages=[SYSTEM], max_tokens=900)
    await client.close()
    assert engine.stats.running == engine.stats.waiting == 0


def test_a_real_process_runs_the_profile_given_on_the_command_line(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["fake-engine", "--port", str(port), "--profile", VLLM, "--pool-tokens", "50000"]
    argv += ["--step-tokens", "512", "--max-running", "8", "--time-scale", "0.01", "--metrics", "vllm"]
    child = ChildProcess("fake-engine", argv, log_path=tmp_path / "engine.log", ready_url=url + "/health")
    child.start()
    try:
        child.wait_ready()
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            answer = client.chat.completions.create(model=MODEL, messages=[SYSTEM], max_tokens=5)
            assert answer.usage is not None and answer.usage.completion_tokens == 5
        with urllib.request.urlopen(url + "/server_info", timeout=10) as resp:
            info = json.loads(resp.read())
        assert (info["max_total_num_tokens"], info["max_running_requests"]) == (50000, 8)
        assert info["chunked_prefill_size"] == 512
        assert info["simulator"]["profile"] == VLLM and info["simulator"]["style"] == "vllm"
        assert info["simulator"]["time_scale"] == 0.01
    finally:
        child.stop()
    assert child.poll() == 0


async def test_the_schedule_policy_reaches_the_step_model_and_needs_a_shared_pool(
    make_engine: Factory,
) -> None:
    engine = await make_engine(profile=SGLANG, schedule_policy="lpm", time_scale=0.01)
    async with aiohttp.ClientSession() as session, session.get(engine.url + "/server_info") as resp:
        info = await resp.json()
    assert info["schedule_policy"] == "lpm"
    for refused in (
        {"profile": "llamacpp-smollm2-135m-cpu", "schedule_policy": "lpm"},  # a pool per slot
        {"profile": SGLANG, "schedule_policy": "lpm", "priority_order": "higher_first"},
        {"schedule_policy": "lpm"},  # the slot model has no step to order
        {"profile": SGLANG, "schedule_policy": "program"},  # Continuum's, for the simulations only
    ):
        with pytest.raises(ValueError, match="schedule_policy"):
            EngineSettings(**refused)


def test_flags_that_size_the_step_model_need_a_profile() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "luftpause",
            "fake-engine",
            "--port",
            str(free_port()),
            "--pool-tokens",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "pool_tokens needs a profile" in done.stderr + done.stdout


async def test_classify_is_a_single_pass_on_the_step_model_and_too_large_an_input_is_400(
    make_engine: Factory,
) -> None:
    engine = await make_engine(profile=VLLM, pool_tokens=1000, time_scale=0.01)
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.url + "/classify", json={"model": MODEL, "input": ["fine"]}) as resp:
            assert resp.status == 200
            assert len((await resp.json())["data"]) == 1
        huge = "x" * 4 * 2000  # 2,000 tokens in a 1,000-token pool
        async with session.post(engine.url + "/classify", json={"model": MODEL, "input": [huge]}) as resp:
            assert resp.status == 400
            assert "tokens of KV" in (await resp.json())["error"]["message"]
    assert engine.stats.completed == 1
