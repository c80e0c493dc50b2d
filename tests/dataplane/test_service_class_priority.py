"""Turns carry their service class to engines that order their waiting queue by ``priority``.

Real processes on loopback: three simulated engines with one running slot each (``lower_first`` as
vLLM, ``higher_first`` as SGLang, and FIFO), a scheduler and a dataplane whose replicas name the
first two engines' order (``[[replicas]] priority``) and leave the third unset. What the engine
received is read back from it (``GET /testkit/request/{id}``: the request body's bytes;
``GET /testkit/started``: the order in which completions got the running slot).

The tagged replicas read their load from a URL whose ``/metrics`` carry no engine's names (the
dataplane's own), so they report no load and the scheduler caps them only by ``max_inflight``
(docs/architecture.md "Engine-load admission"): every turn goes on into the engine's queue, as a burst does
before the engine's capacity is learned, and no probe can start capping the replica mid-test.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from luftpause.scheduler.probes import EngineLoad, parse_load
from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration

# Engine name -> (its --priority, the replica's priority setting or None, the model it serves).
ENGINES = {
    "lower": ("lower_first", "lower_first", "m-lower"),
    "higher": ("higher_first", "higher_first", "m-higher"),
    "plain": ("fcfs", None, "m-plain"),
}
DECODE_MS = 10.0
# The turn that holds the one running slot while the others queue: 300 tokens at DECODE_MS each,
# 3 s, far longer than queueing the others takes.
LONG_TOKENS = 300
QUEUED_BATCH_TURNS = 3
# The value the engine serves first goes to interactive turns (luftpause.dataplane.relay).
EXPECTED = {"lower": {"interactive": 0, "batch": 1}, "higher": {"interactive": 1, "batch": 0}}


@dataclass
class Pool:
    """The running processes: engine URLs by name, the dataplane's URL."""

    dataplane_url: str
    engine_urls: dict[str, str]
    children: list[ChildProcess] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"--- {child.name}\n{child.log_tail()}" for child in self.children)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    workdir: Path = tmp_path_factory.mktemp("priority")
    engine_ports = {name: free_port() for name in ENGINES}
    grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
    dataplane_url = f"http://127.0.0.1:{dp_port}"
    replicas = ""
    for name, (_, setting, model) in ENGINES.items():
        replicas += (
            f'\n[[replicas]]\nname = "{name}"\nurl = "http://127.0.0.1:{engine_ports[name]}"\n'
            f'models = ["{model}"]\nmax_inflight = 8\nload_from = ["{dataplane_url}"]\n'
        )
        if setting is not None:
            replicas += f'priority = "{setting}"\n'
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"

[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"
{replicas}"""
    )
    running = Pool(dataplane_url, {name: f"http://127.0.0.1:{port}" for name, port in engine_ports.items()})
    plan = [
        (
            f"engine-{name}",
            [
                *("fake-engine", "--port", str(engine_ports[name]), "--model", model, "--slots", "1"),
                *("--decode-ms", str(DECODE_MS), "--priority", order),
            ],
            f"{running.engine_urls[name]}/health",
        )
        for name, (order, _, model) in ENGINES.items()
    ]
    plan += [
        ("scheduler", ["scheduler", "--config", str(config)], f"http://127.0.0.1:{status_port}/health"),
        ("dataplane", ["dataplane", "--config", str(config)], f"{dataplane_url}/health"),
    ]
    try:
        for name, argv, ready_url in plan:
            child = ChildProcess(name, argv, workdir / f"{name}.log", ready_url=ready_url)
            running.children.append(child.start())
            child.wait_ready()
        if not _until(lambda: orjson.loads(_get(f"{dataplane_url}/health"))["scheduler"] == "connected"):
            raise RuntimeError(f"the dataplane did not connect:\n{running.logs()}")
        yield running
    finally:
        for child in reversed(running.children):
            child.stop()


def _until(check: Any, timeout: float = 30.0) -> bool:
    """Poll ``check()`` every 20 ms until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _body(model: str, max_tokens: int = 1, **extra: Any) -> bytes:
    """A chat request as a client might write it: spaces after the separators, so that bytes the
    dataplane re-encoded would show."""
    return orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, **extra}
    ).replace(b'":', b'": ')


def _turn(pool: Pool, body: bytes, service_class: str) -> str:
    """Send one chat turn through the dataplane; the completion id of its answer (200 expected).
    Streamed or not, as the body says."""
    request = urllib.request.Request(
        f"{pool.dataplane_url}/v1/chat/completions",
        data=body,
        method="POST",
        headers={"content-type": "application/json", "x-luftpause-class": service_class},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = response.read()
    if answer.startswith(b"data: "):
        answer = answer.split(b"\n", 1)[0].removeprefix(b"data: ")
    completion_id: str = orjson.loads(answer)["id"]
    return completion_id


def _received(pool: Pool, engine: str, completion_id: str) -> bytes:
    """The request body bytes ``engine`` received for ``completion_id``."""
    return _get(f"{pool.engine_urls[engine]}/testkit/request/{completion_id}")


def _load(pool: Pool, engine: str) -> EngineLoad:
    return parse_load(_get(f"{pool.engine_urls[engine]}/metrics").decode())


@pytest.mark.parametrize("engine", ["lower", "higher"])
def test_an_interactive_turn_is_served_before_batch_turns_already_queued_in_the_engine(
    pool: Pool, engine: str
) -> None:
    model = ENGINES[engine][2]
    with ThreadPoolExecutor(max_workers=QUEUED_BATCH_TURNS + 2) as threads:
        long: Future[str] = threads.submit(_turn, pool, _body(model, LONG_TOKENS), "batch")
        assert _until(lambda: _load(pool, engine).running == 1), pool.logs()
        queued: list[Future[str]] = []
        for count in range(1, QUEUED_BATCH_TURNS + 1):
            queued.append(threads.submit(_turn, pool, _body(model), "batch"))
            assert _until(lambda: _load(pool, engine).waiting == count), pool.logs()  # noqa: B023
        interactive = threads.submit(_turn, pool, _body(model), "interactive")
        # It reached the engine's queue while the long turn still held the slot.
        queued_with_it = QUEUED_BATCH_TURNS + 1
        assert _until(lambda: _load(pool, engine).waiting == queued_with_it), (
            "the interactive turn did not queue behind the long one: " + pool.logs()
        )
        long_id, interactive_id = long.result(), interactive.result()
        queued_ids = [future.result() for future in queued]
    started = orjson.loads(_get(f"{pool.engine_urls[engine]}/testkit/started"))
    ours = [each for each in started if each in {long_id, interactive_id, *queued_ids}]
    assert ours == [long_id, interactive_id, *queued_ids]
    values = EXPECTED[engine]
    assert orjson.loads(_received(pool, engine, interactive_id))["priority"] == values["interactive"]
    for completion_id in (long_id, *queued_ids):
        assert orjson.loads(_received(pool, engine, completion_id))["priority"] == values["batch"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("service_class", ["interactive", "batch"])
@pytest.mark.parametrize("engine", ["lower", "higher"])
def test_the_class_is_spliced_after_the_opening_brace_and_the_rest_is_the_clients_bytes(
    pool: Pool, engine: str, service_class: str, stream: bool
) -> None:
    body = b"  " + _body(ENGINES[engine][2], stream=stream)  # JSON whitespace may precede the object
    completion_id = _turn(pool, body, service_class)
    value = EXPECTED[engine][service_class]
    assert _received(pool, engine, completion_id) == b'  {"priority":%d,' % value + body[3:]


@pytest.mark.parametrize("key", [b'"priority"', b'"\\u0070riority"'])
def test_a_priority_the_client_set_is_sent_as_it_came(pool: Pool, key: bytes) -> None:
    untagged = _body("m-lower")
    tagged = untagged.replace(b'{"model"', b"{" + key + b': 7, "model"')
    assert orjson.loads(tagged)["priority"] == 7
    # The same turn without one is tagged, so the replica is set up to tag.
    assert orjson.loads(_received(pool, "lower", _turn(pool, untagged, "batch")))["priority"] == 1
    assert _received(pool, "lower", _turn(pool, tagged, "batch")) == tagged


def test_a_replica_without_the_setting_gets_the_clients_body_byte_identical(pool: Pool) -> None:
    for service_class in ("interactive", "batch"):
        plain = _body("m-plain")
        assert _received(pool, "plain", _turn(pool, plain, service_class)) == plain
        # The same body to a replica with the setting is not.
        lower = _body("m-lower")
        assert _received(pool, "lower", _turn(pool, lower, service_class)) != lower
