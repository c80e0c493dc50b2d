"""Engine probes: Prometheus load parsing, health and load over real HTTP, and a stack whose engines
stop and come back.

The HTTP tests serve ``/health`` and ``/metrics`` from aiohttp apps on free loopback ports in this
process; the integration test runs a whole stack as real processes (``luftpause.testkit.launch.stack``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from repo_paths import DATA

from luftpause.config import parse_config
from luftpause.scheduler.probes import NO_KNOWN_METRICS, EngineLoad, combine, parse_load, probe_replica
from luftpause.testkit.engine.metrics import ModelLoad, SglangMetrics
from luftpause.testkit.launch.procs import free_port
from luftpause.testkit.launch.stack import Stack

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
"""


# -- parsing ----------------------------------------------------------------------------------------


def test_sglang_counts_are_summed_over_models_and_the_shared_pool_read_once() -> None:
    metrics = SglangMetrics(["m1", "m2"], slots=4)
    text = metrics.render({"m1": ModelLoad(2, 1, 8192), "m2": ModelLoad(1, 3, 8192)}).decode()
    assert parse_load(text) == EngineLoad(
        running=3, waiting=4, kv_usage=0.5, cache_hit_rate=0.0, engine="sglang"
    )


def test_vllm_counts_are_summed_and_fractions_averaged_over_data_parallel_ranks() -> None:
    text = VLLM_TEXT + 'vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.75\n'
    assert parse_load(text) == EngineLoad(
        running=5, waiting=4, kv_usage=0.5, cache_hit_rate=None, engine="vllm"
    )


LLAMACPP_TEXT = (DATA / "llamacpp_metrics_loaded.txt").read_text()
"""A real llama-server's /metrics with 2 slots busy and 3 requests deferred (tests/data/README.md)."""


def test_llama_cpp_busy_slots_are_running_and_deferred_requests_waiting() -> None:
    # the input that broke it (issue 13): the server's real names were not read, so the replica
    # showed no load, kept max_inflight (32) and took every turn into llama.cpp's FIFO queue
    load = parse_load(LLAMACPP_TEXT)
    assert (load.running, load.waiting, load.engine, load.unknown) == (2, 3, "llama.cpp", None)
    assert load.kv_usage is None  # this build reports no KV cache usage
    assert load.cache_hit_rate == pytest.approx(68 / (84 + 68))  # cached / (computed + cached)


def test_a_llama_server_that_has_seen_no_prompt_has_no_hit_rate_yet() -> None:
    text = LLAMACPP_TEXT.replace("prompt_tokens_total 84", "prompt_tokens_total 0").replace(
        "prompt_tokens_cached_total 68", "prompt_tokens_cached_total 0"
    )
    assert parse_load(text).cache_hit_rate is None


@pytest.mark.parametrize(
    "text",
    [VLLM_TEXT, LLAMACPP_TEXT, SglangMetrics(["m"], slots=4).render({"m": ModelLoad(1, 0, 8192)}).decode()],
    ids=["vllm", "llama.cpp", "sglang"],
)
def test_every_engine_named_in_the_docs_gives_both_counts(text: str) -> None:
    load = parse_load(text)
    assert load.running is not None and load.waiting is not None and load.unknown is None


def test_a_running_count_without_a_waiting_count_is_no_load_and_says_which_is_missing() -> None:
    load = parse_load("# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n")
    assert (load.running, load.waiting, load.engine) == (None, None, None)
    assert load.unknown == "its /metrics carry llamacpp:requests_processing but no waiting count"


def test_only_the_families_read_are_parsed_so_other_lines_cannot_break_them() -> None:
    noise = '# TYPE other_histogram histogram\nother_histogram_bucket{le="+Inf"} not-a-number\n'
    assert parse_load(noise + VLLM_TEXT).running == 5


def test_metrics_without_known_names_report_no_load() -> None:
    text = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n"
    assert parse_load(text) == EngineLoad(unknown=NO_KNOWN_METRICS)


def test_unreadable_metrics_raise_value_error() -> None:
    with pytest.raises(ValueError):
        parse_load("vllm:num_requests_running{engine= 3\n")


def test_a_router_sums_counts_and_averages_fractions_of_its_engines() -> None:
    loads = [EngineLoad(2, 1, 0.2, None, "vllm"), EngineLoad(3, 0, 0.6, 0.5, "sglang"), EngineLoad()]
    assert combine(loads) == EngineLoad(5, 1, pytest.approx(0.4), 0.5, "sglang, vllm")  # type: ignore[arg-type]
    assert combine([]) == EngineLoad(unknown="no load was read")


def test_a_router_whose_engines_all_report_no_load_says_why() -> None:
    loads = [EngineLoad(unknown="GET a answered 404"), EngineLoad(unknown="GET b failed: TimeoutError")]
    assert combine(loads).unknown == "GET a answered 404; GET b failed: TimeoutError"


# -- over HTTP --------------------------------------------------------------------------------------


@asynccontextmanager
async def engine(health_status: int = 200, text: str = VLLM_TEXT) -> AsyncIterator[tuple[str, list[str]]]:
    """A fake engine on a free port: its URL and the Authorization headers it received."""
    seen: list[str] = []

    async def health(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(status=health_status)

    async def metrics(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/ready", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def replica(url: str, extra: str = "") -> Any:
    config = parse_config(
        f'[[replicas]]\nname = "r"\nurl = "{url}"\nmodels = ["m"]\nhealth_path = "/ready"\n{extra}', "t.toml"
    )
    return config.replicas[0]


def test_a_healthy_engine_reports_its_load_and_gets_the_replica_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_TEST_KEY", "sekret")

    async def scenario() -> tuple[bool, EngineLoad, list[str]]:
        async with engine() as (url, seen), aiohttp.ClientSession() as session:
            healthy, load = await probe_replica(session, replica(url, 'api_key_env = "PROBE_TEST_KEY"'))
            return healthy, load, seen

    healthy, load, seen = asyncio.run(scenario())
    assert healthy
    assert load == EngineLoad(5, 4, 0.25, None, "vllm")
    assert seen == ["Bearer sekret", "Bearer sekret"]


def test_a_failing_health_check_is_unhealthy() -> None:
    async def scenario() -> bool:
        async with engine(health_status=503) as (url, _), aiohttp.ClientSession() as session:
            healthy, _load = await probe_replica(session, replica(url))
            return healthy

    assert asyncio.run(scenario()) is False


def test_an_unreachable_engine_is_unhealthy_with_no_load() -> None:
    async def scenario() -> tuple[bool, EngineLoad]:
        async with aiohttp.ClientSession() as session:
            return await probe_replica(session, replica(f"http://127.0.0.1:{free_port()}"))

    healthy, load = asyncio.run(scenario())
    assert (healthy, load.running, load.waiting) == (False, None, None)
    assert load.unknown is not None and load.unknown.endswith("/metrics failed: ClientConnectorError")


def test_an_engine_without_metrics_says_so() -> None:
    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    async def scenario() -> EngineLoad:
        app = web.Application()  # no /metrics: 404, as on Ollama
        app.router.add_get("/ready", ready)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session:
                healthy, load = await probe_replica(session, replica(f"http://127.0.0.1:{port}"))
                assert healthy
                return load
        finally:
            await runner.cleanup()

    load = asyncio.run(scenario())
    assert (load.running, load.waiting) == (None, None)
    assert load.unknown is not None and load.unknown.endswith("/metrics answered 404")


def test_a_health_check_that_times_out_is_unhealthy() -> None:
    async def scenario() -> bool:
        async def slow(request: web.Request) -> web.Response:
            await asyncio.sleep(5)
            return web.Response()

        app = web.Application()
        app.router.add_get("/ready", slow)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            timeout = aiohttp.ClientTimeout(total=0.2)  # the shell uses 2 s; the behaviour is the same
            async with aiohttp.ClientSession(timeout=timeout) as session:
                healthy, _ = await probe_replica(session, replica(f"http://127.0.0.1:{port}"))
                return healthy
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) is False


def test_a_router_reads_its_load_from_the_engines_behind_it() -> None:
    async def scenario() -> tuple[bool, EngineLoad, list[str]]:
        async with (
            engine(health_status=200, text="") as (router, router_seen),
            engine() as (one, _),
            engine() as (two, _),
            aiohttp.ClientSession() as session,
        ):
            healthy, load = await probe_replica(session, replica(router, f'load_from = ["{one}", "{two}"]'))
            return healthy, load, router_seen

    healthy, load, router_seen = asyncio.run(scenario())
    assert healthy
    assert load == EngineLoad(10, 8, 0.25, None, "vllm")
    assert len(router_seen) == 1  # its health only, not its metrics


def test_a_routers_key_goes_to_the_router_only_never_to_engines_on_other_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROBE_TEST_KEY", "router-secret")

    async def scenario() -> tuple[list[str], list[str]]:
        async with (
            engine() as (router, router_seen),
            engine() as (behind, behind_seen),
            aiohttp.ClientSession() as session,
        ):
            extra = f'api_key_env = "PROBE_TEST_KEY"\nload_from = ["{behind}"]'
            await probe_replica(session, replica(router, extra))
            return router_seen, behind_seen

    router_seen, behind_seen = asyncio.run(scenario())
    assert router_seen == ["Bearer router-secret"]
    assert behind_seen == [""]  # another origin (its own port): no key


def test_an_empty_health_path_is_not_checked() -> None:
    async def scenario() -> bool:
        async with engine(health_status=503) as (url, seen), aiohttp.ClientSession() as session:
            config = parse_config(
                f'[[replicas]]\nname = "r"\nurl = "{url}"\nmodels = ["m"]\nhealth_path = ""\n', "t.toml"
            )
            healthy, _ = await probe_replica(session, config.replicas[0])
            assert len(seen) == 1  # metrics only
            return healthy

    assert asyncio.run(scenario()) is True


# -- a stack whose engines stop and come back -------------------------------------------------------

WAIT_S = 20.0  # a fail-safe for polling, never a measured bound


@pytest.fixture(scope="module")
def probed_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack.start(tmp_path_factory.mktemp("probed"))
    try:
        yield running
    finally:
        running.stop()


def _status(stack: Stack) -> dict[str, Any]:
    async def get() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(stack.status_url) as response:
            result: dict[str, Any] = orjson.loads(await response.read())
            return result

    return asyncio.run(get())


def _until(stack: Stack, check: Any) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    status = _status(stack)
    while not check(status):
        assert time.monotonic() < deadline, f"status never matched: {status}\n{stack.logs()}"
        time.sleep(0.1)
        status = _status(stack)
    return status


@pytest.mark.integration
def test_stopped_engines_are_unhealthy_and_their_turns_held_until_one_is_back(probed_stack: Stack) -> None:
    stack = probed_stack
    engines = [stack.children["engine0"], stack.children["engine1"]]
    healthy = _until(
        stack, lambda s: all(r["healthy"] and r["probed_s_ago"] is not None for r in s["replicas"])
    )
    assert all(
        r["running"] == 0 and r["waiting"] == 0 for r in healthy["replicas"]
    )  # the simulator's metrics

    engines[0].stop()
    _until(stack, lambda s: [r["healthy"] for r in s["replicas"]] == [False, True])

    async def ask(run_id: str) -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{stack.dataplane_url}/v1/chat/completions",
                json={"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
                headers={"x-luftpause-run-id": run_id},
                timeout=aiohttp.ClientTimeout(total=60),
            ) as response,
        ):
            await response.read()
            return response.status

    # with one engine down, a turn goes to the other (the only process left to answer it)
    assert asyncio.run(ask("probe-one-down")) == 200

    engines[1].stop()
    _until(stack, lambda s: not any(r["healthy"] for r in s["replicas"]))
    before = _status(stack)["counters"]

    async def held_then_placed() -> tuple[dict[str, Any], int]:
        turn = asyncio.create_task(ask("probe-all-down"))
        deadline = time.monotonic() + WAIT_S
        while True:  # the model is known: the turn waits, it is not refused
            status = await asyncio.to_thread(_status, stack)
            if status["held"]["count"] == 1:
                break
            assert not turn.done() and time.monotonic() < deadline, f"{status}\n{stack.logs()}"
            await asyncio.sleep(0.1)
        await asyncio.to_thread(stack.restart, "engine0")  # a ChildProcess starts once: a new one
        return status, await turn

    held, code = asyncio.run(held_then_placed())
    assert held["counters"]["rejected"] == before["rejected"]
    assert code == 200
    after = _until(stack, lambda s: s["replicas"][0]["healthy"] and s["held"]["count"] == 0)
    assert after["counters"]["admitted"] == before["admitted"] + 1
    stack.restart("engine1")
