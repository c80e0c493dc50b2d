"""Replicas at run time and protection limits with real processes (issue 18): the scheduler's admin
API adds a third engine and turns reach it; a drained replica under load gets no new run and loses
no turn; SIGHUP with an edited file removes a replica; a caller over its held-turn limit gets 429
with Retry-After through the ``openai`` client (``RateLimitError``)."""

from __future__ import annotations

import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "admin-test-token"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # one slot per replica, 20 ms per token; the anonymous caller may hold at most 2 turns
    limits = "[scheduler.protection.interactive]\nmax_held = 2\n"
    # The token of the whole stack: the scheduler's admin API takes it, and so does its gRPC link
    # (a dataplane without it is refused), the stack's own requests carry it.
    running = Stack.start(
        tmp_path_factory.mktemp("replicas"),
        max_inflight=1,
        decode_ms=20.0,
        scheduler_config=limits,
        env={"LUFTPAUSE_TOKEN": TOKEN},
    )
    running.wait_connected()
    try:
        yield running
    finally:
        running.stop()


def _admin(stack: Stack, method: str, path: str, body: object = None, token: str = TOKEN) -> tuple[int, Any]:
    url = stack.status_url.removesuffix("/status") + path
    data = None if body is None else orjson.dumps(body)
    request = urllib.request.Request(
        url, data=data, method=method, headers={"authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def _status(stack: Stack) -> dict[str, Any]:
    request = urllib.request.Request(stack.status_url, headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = orjson.loads(response.read())
        return result


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key=TOKEN, max_retries=0, timeout=60)


def _engine(stack: Stack, name: str) -> tuple[ChildProcess, str]:
    port = free_port()
    argv = ["fake-engine", "--port", str(port), "--model", DEFAULT_MODEL, "--decode-ms", "20"]
    child = ChildProcess(
        name, argv, stack.workdir / f"{name}.log", ready_url=f"http://127.0.0.1:{port}/health"
    )
    stack.children[name] = child.start()
    child.wait_ready()
    return child, f"http://127.0.0.1:{port}"


def test_the_admin_api_needs_the_token(stack: Stack) -> None:
    status, body = _admin(stack, "GET", "/admin/replicas", token="wrong")
    assert status == 401 and "bearer token" in body["error"]["message"]
    status, body = _admin(
        stack, "POST", "/admin/replicas", {"name": "x", "url": "ftp://nope", "models": ["m"]}
    )
    assert status == 400 and body["error"]["message"].startswith("url: expected an http:// or https:// URL")
    status, body = _admin(stack, "POST", "/admin/replicas/nope/drain")
    assert status == 404 and body == {"error": {"message": "no replica 'nope' in the set"}}


def test_a_replica_added_through_the_api_takes_turns(stack: Stack) -> None:
    _, url = _engine(stack, "engine-added")
    status, body = _admin(
        stack,
        "POST",
        "/admin/replicas",
        {"name": "added", "url": url, "models": [DEFAULT_MODEL], "max_inflight": 1},
    )
    assert status == 201 and body["replica"]["name"] == "added", body
    assert _admin(stack, "POST", "/admin/replicas", {"name": "added", "url": url, "models": ["m"]})[0] == 409
    listed = _admin(stack, "GET", "/admin/replicas")[1]["replicas"]
    assert [(r["name"], r["state"]) for r in listed] == [
        ("sim-0", "in rotation"),
        ("sim-1", "in rotation"),
        ("added", "in rotation"),
    ]
    client = _client(stack)
    # three runs at once, one slot each: one of them goes to the added engine
    clients = stack.stream_clients(3, max_tokens=100, run_prefix="spread")
    try:
        seen = stack.wait_status(lambda s: any(r["name"] == "added" and r["inflight"] for r in s["replicas"]))
    finally:
        for proc in clients:
            assert proc.wait(timeout=60) == 0
    assert any(r["name"] == "added" and r["inflight"] == 1 for r in seen["replicas"]), seen
    done = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert done.choices[0].message.content


def test_a_drained_replica_under_load_takes_no_new_run_and_loses_no_turn(stack: Stack) -> None:
    # the earlier tests' turns all reported, so the counters below count only this test's turns
    before = stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 0)
    busy = stack.stream_clients(3, max_tokens=150, run_prefix="busy")
    try:
        stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 3)
        assert _admin(stack, "POST", "/admin/replicas/sim-0/drain")[0] == 200
        drained = stack.wait_status(lambda s: s["replicas"][0]["draining"])
        assert drained["replicas"][0]["draining"] and drained["replicas"][0]["inflight"] == 1
        later = stack.stream_clients(2, max_tokens=2, run_prefix="later")
        for proc in [*busy, *later]:
            assert proc.wait(timeout=60) == 0, "a turn was lost"
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    after = stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 0)
    assert after["counters"]["finished"] - before["counters"]["finished"] == 5
    assert after["counters"]["failed"] == before["counters"]["failed"]
    assert after["replicas"][0]["inflight"] == 0
    assert _admin(stack, "POST", "/admin/replicas/sim-0/restore")[0] == 200


def test_sighup_with_an_edited_file_makes_the_set_what_the_file_says(stack: Stack) -> None:
    added = next(r for r in _admin(stack, "GET", "/admin/replicas")[1]["replicas"] if r["name"] == "added")
    config = Path(stack.config_path)
    text = config.read_text()
    start = text.index('[[replicas]]\nname = "sim-1"')
    end = text.index("[[mcp_servers]]")
    kept = (
        f'[[replicas]]\nname = "added"\nurl = "{added["url"]}"\n'
        f'models = ["{DEFAULT_MODEL}"]\nmax_inflight = 1\n\n'
    )
    config.write_text(text[:start] + kept + text[end:])  # sim-1 out; the replica the API added, in
    scheduler = stack.children["scheduler"].proc
    assert scheduler is not None
    scheduler.send_signal(signal.SIGHUP)
    gone = stack.wait_status(lambda s: "sim-1" not in [r["name"] for r in s["replicas"]])
    assert [r["name"] for r in gone["replicas"]] == ["sim-0", "added"], gone["replicas"]
    assert gone["counters"]["replicas_retired"] == 1
    # a file the scheduler refuses changes nothing
    config.write_text(text[:start] + "[[replicas]]\nname = 3\n" + text[end:])
    scheduler.send_signal(signal.SIGHUP)
    assert [r["name"] for r in _status(stack)["replicas"]] == ["sim-0", "added"]


def test_a_caller_over_its_held_limit_gets_429_with_retry_after(stack: Stack) -> None:
    occupiers = stack.stream_clients(2, max_tokens=400, run_prefix="occupy")
    waiting = []
    try:
        stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 2)
        waiting = stack.stream_clients(2, max_tokens=2, run_prefix="wait")
        stack.wait_status(lambda s: s["held"]["count"] == 2)
        with pytest.raises(openai.RateLimitError) as refused:
            _client(stack).chat.completions.create(
                model=DEFAULT_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert refused.value.response.headers["retry-after"] == "1"
        assert "max_held = 2" in refused.value.response.json()["error"]["message"]
        assert _status(stack)["limits"]["refused"]["held"] == 1
    finally:
        for proc in occupiers:
            proc.kill()
            proc.wait()  # reaped: a Popen collected while its child is unreaped warns (ResourceWarning)
    for proc in waiting:
        assert proc.wait(timeout=60) == 0
