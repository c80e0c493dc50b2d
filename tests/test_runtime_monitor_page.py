"""The monitor page (``GET /monitor``) in headless Chromium, driven like a person would: the test
speaks the Chrome DevTools Protocol over a websocket (aiohttp's client) to click a run in the
tree, type a message into the page's form, press Send, then press Stop, with real mouse and
keyboard input events. The run and its spawner must hear of both.

Real processes: the runtime (with a bearer token, which the page takes from ``?token=``) and a
scripted engine (:mod:`pods_helpers`). Chromium must be installed (``/usr/bin/chromium``);
without it the test fails, it is never skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pods_helpers import Pod, call, script, start_pod, until

from luftpause.testkit.loadgen import runtime_client
from luftpause.testkit.procs import free_port

pytestmark = pytest.mark.integration

TOKEN = "monitor-test-token"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        pytest.fail("chromium is not installed (Debian: apt-get install chromium)")
    return found


@pytest.fixture()
def pod(tmp_path: Path) -> Iterator[Pod]:
    with start_pod(tmp_path, token=TOKEN) as running:
        yield running


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[int]:
    """Headless Chromium with its DevTools port; killed afterwards."""
    port = free_port()
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    process = subprocess.Popen(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError("chromium's DevTools port never opened") from None
                time.sleep(0.1)
        yield port
    finally:
        # its whole session: the zygote and renderers are Chromium's children, not ours to reap
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(10)


class Page:
    """A minimal CDP client for one page target."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self.ids)
        await self.ws.send_json({"id": message_id, "method": method, "params": params})
        while True:
            reply = await self.ws.receive_json(timeout=30)
            if reply.get("id") == message_id:
                assert "error" not in reply, reply
                result: dict[str, Any] = reply.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def center(self, selector: str) -> tuple[float, float] | None:
        rect = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        return (rect[0], rect[1]) if rect else None

    async def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the element's centre."""
        point = await until(lambda: self.center(selector), f"{selector} on the page")
        x, y = point
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    async def type(self, text: str) -> None:
        await self.send("Input.insertText", text=text)

    async def text(self, selector: str) -> str:
        found = f"document.querySelector({json.dumps(selector)})"
        value = await self.evaluate(f"(() => {{ const e = {found}; return e ? e.textContent : ''; }})()")
        return str(value or "")


async def open_page(devtools_port: int, url: str, session: aiohttp.ClientSession) -> Page:
    async with session.get(f"http://127.0.0.1:{devtools_port}/json/list") as response:
        targets = await response.json()
    target = next(t for t in targets if t["type"] == "page")
    ws = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
    page = Page(ws)
    await page.send("Page.enable")
    await page.send("Page.navigate", url=url)
    return page


def _conversation(pod: Pod, handle: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{pod.url}/monitor/runs/{handle}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_person_sends_a_message_and_stops_a_run_from_the_page(pod: Pod, browser: int) -> None:
    child_task = script({"say": "c ready"}, {"say": "c got it"}, {"say": "c again"})
    a_task = script(
        {"call": "spawn", "args": {"task": child_task, "name": "c"}},
        {"say": "A waiting"},
        {"echo": "new-system"},
    )
    message = "please look at <b>this</b>"

    async def go() -> None:
        async with runtime_client(f"{pod.url}/mcp", TOKEN) as client, aiohttp.ClientSession() as session:
            a = (await call(client, "spawn", task=a_task, name="a", orchestrate=True))["handle"]

            async def child_idle() -> Any:
                runs = (await call(client, "list", handle=a))["runs"]
                top = await call(client, "read", handle=a)
                ready = runs and runs[0]["state"] == "idle" and top["state"] == "idle"
                return runs[0]["handle"] if ready else None

            c = await until(child_idle, "A and c idle")
            # The page without the token is refused data, and says so.
            async with session.get(f"{pod.url}/monitor/runs") as refused:
                assert refused.status == 401
            page = await open_page(browser, f"{pod.url}/monitor?token={TOKEN}", session)
            try:
                # The tree shows c under a, with its state and last answer.
                node = f'li[data-handle="{a}"] li[data-handle="{c}"] .run'
                await until(lambda: page.center(node), "c under a in the tree")
                assert "c ready" in await page.text(node)
                await page.click(node)
                await until(lambda: page.center("#detail:not([hidden]) #message"), "the run's form")
                await page.click("#message")
                await page.type(message)
                await page.click("#send-button")

                async def c_answered_again() -> bool:
                    convo = _conversation(pod, c)
                    return convo["run"]["state"] == "idle" and convo["run"]["lastAnswer"] == "c got it"

                await until(c_answered_again, "c's answer to the person's message")
                users = [m["content"] for m in _conversation(pod, c)["messages"] if m["role"] == "user"]
                assert users[-1] == f"[message from a person (monitor)] {message}"
                # The page's answer to its POST may come after the run's turn (a loaded machine).
                await until(lambda: _action_says(page, "sent ("), "the page saying it sent")

                # The conversation is shown as text, markup included literally. (Not waited for
                # by "c got it": the task's script in the first message names it already.)
                async def both_shown() -> bool:
                    shown = await page.text("#conversation")
                    return message in shown and "assistantc got it" in shown

                await until(both_shown, "the person's message and c's answer on the page")

                await page.click("#stop-button")
                await until(lambda: _state_shown(page, node, "stopped"), "c stopped on the page")
                assert _conversation(pod, c)["run"]["state"] == "stopped"
            finally:
                await page.ws.close()

            # The spawner hears of both at its next turn, once.
            await call(client, "send", handle=a, message="report")

            async def report() -> str | None:
                result = await call(client, "read", handle=a)
                return (
                    result["entries"][-1]
                    if result["state"] == "idle" and len(result["entries"]) == 2
                    else None
                )

            text = await until(report, "A's report")
            assert f"message: child 'c' ({c}): a person (monitor) sent it a message" in text
            assert f"stopped: child 'c' ({c}): stopped by a person (monitor)" in text

    asyncio.run(go())


def test_a_failed_child_is_shown_failed_not_idle(pod: Pod, browser: int) -> None:
    # It was shown "idle", like a child that answered: a failure looked like a rest.
    child = script({"refuse": 503, "error": "engine sim-a: overloaded"})
    parent = script({"call": "spawn", "args": {"task": child, "name": "broken"}}, {"say": "A waits"})

    async def go() -> tuple[str, str, str]:
        async with runtime_client(f"{pod.url}/mcp", TOKEN) as client, aiohttp.ClientSession() as session:
            a = (await call(client, "spawn", task=parent, name="a", orchestrate=True))["handle"]

            async def child_failed() -> Any:
                runs = (await call(client, "list", handle=a))["runs"]
                return runs[0] if runs and runs[0]["runState"] == "failed" else None

            failed = await until(child_failed, "the child to fail")
            assert failed["state"] == "idle"  # list keeps the pod state, and says runState beside it
            page = await open_page(browser, f"{pod.url}/monitor?token={TOKEN}", session)
            try:
                node = f'li[data-handle="{a}"] li[data-handle="{failed["handle"]}"] .run'
                await until(lambda: _state_shown(page, node, "failed"), "the child shown failed")
                badge = await page.text(node + " .state")
                title = await page.evaluate(f"document.querySelector({json.dumps(node + ' .state')}).title")
                await page.click(node)
                await until(lambda: _state_shown(page, "#detail", "failed"), "the detail shown failed")
                return badge, str(title), await page.text("#detail-state")
            finally:
                await page.ws.close()

    badge, title, detail = asyncio.run(go())
    assert badge == detail == "failed"
    assert "engine sim-a: overloaded" in title


async def _action_says(page: Page, text: str) -> bool:
    return text in await page.text("#action-result")


async def _shows(page: Page, text: str) -> bool:
    return text in await page.text("#conversation")


async def _state_shown(page: Page, selector: str, state: str) -> bool:
    return bool(await page.evaluate(f"!!document.querySelector({json.dumps(selector + ' .state-' + state)})"))


def _request(pod: Pod, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    request = urllib.request.Request(f"{pod.url}{path}", data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


HOLD_NEXT_ANSWER = """(() => {
  const realFetch = window.fetch;
  let held = true;
  let release;
  const gate = new Promise((resolve) => { release = resolve; });
  window.fetch = async (...args) => {
    const response = await realFetch(...args);
    if (held && String(args[0]).startsWith("monitor/runs/%s?")) { held = false; await gate; }
    return response;
  };
  window.releaseOlder = release;
  shown = null;  // so that this request asks for the whole conversation ("from 0")
  window.older = showDetail(%s);
  return true;
})()"""
"""Page script (``% (handle, JSON handle)``): ask for the run's whole conversation now and hold
its answer until ``releaseOlder()``; ``older`` is the showDetail call's promise."""


def test_an_older_answer_arriving_late_never_replaces_a_newer_conversation(pod: Pod, browser: int) -> None:
    # CI: the conversation shown went back to the run's first two messages after its newer ones
    # were on the page: an answer to an earlier "from 0" request, delivered late, replaced them.
    task = script({"say": "c ready"}, {"say": "c got it"})

    async def go() -> None:
        async with runtime_client(f"{pod.url}/mcp", TOKEN) as client, aiohttp.ClientSession() as session:
            c = (await call(client, "spawn", task=task, name="c"))["handle"]

            async def idle_with(answer: str) -> bool:
                run = _conversation(pod, c)["run"]
                return bool(run["state"] == "idle" and run["lastAnswer"] == answer)

            await until(lambda: idle_with("c ready"), "c idle")
            page = await open_page(browser, f"{pod.url}/monitor?token={TOKEN}", session)
            try:
                await page.click(f'li[data-handle="{c}"] .run')
                await until(lambda: _shows(page, "c ready"), "c's conversation on the page")
                handle = json.dumps(c)
                assert await page.evaluate(HOLD_NEXT_ANSWER % (c, handle)) is True
                await call(client, "send", handle=c, message="and now?")
                await until(lambda: idle_with("c got it"), "c's second answer")
                # (the task's script names "c got it" too: the person's message tells the newer one)
                await until(lambda: _shows(page, "and now?"), "the newer conversation on the page")
                await page.send(
                    "Runtime.evaluate",
                    expression="releaseOlder(), older",
                    awaitPromise=True,
                    returnByValue=True,
                )
                assert "and now?" in await page.text("#conversation")
            finally:
                await page.ws.close()

    asyncio.run(go())


@pytest.fixture()
def open_pod(tmp_path: Path) -> Iterator[Pod]:
    with start_pod(tmp_path) as running:
        yield running


def test_cross_site_requests_cannot_message_stop_or_read_runs(open_pod: Pod) -> None:
    """No token (the default): a page on another site, or a DNS-rebound name, must not act."""
    running = open_pod

    async def spawn() -> str:
        async with runtime_client(f"{running.url}/mcp") as client:
            return str((await call(client, "spawn", task=script({"hold": "never", "say": "x"})))["handle"])

    handle = asyncio.run(spawn())
    send = f"/monitor/runs/{handle}/send"
    own = running.url
    body = json.dumps({"message": "hi"}).encode()
    # A cross-site form: text/plain, its own Origin
    assert _request(running, "POST", send, body, **{"Content-Type": "text/plain", "Origin": own})[0] == 415
    json_type = {"Content-Type": "application/json"}
    assert _request(running, "POST", send, body, **json_type, Origin="http://evil.example")[0] == 403
    assert _request(running, "POST", f"/monitor/runs/{handle}/stop", b"{}", **json_type)[0] == 403
    rebound = {"Host": "evil.example:80"}
    assert _request(running, "GET", "/monitor/runs", **rebound)[0] == 421
    big = json.dumps({"message": "x" * (1024 * 1024 + 1)}).encode()
    assert _request(running, "POST", send, big, **json_type, Origin=own)[0] == 413
    status, answer = _request(running, "POST", send, body, **json_type, Origin=own)
    assert status == 200 and answer["delivered"] == "next turn"
    status, runs = _request(running, "GET", "/monitor/runs")
    assert status == 200 and [r["handle"] for r in runs["runs"]] == [handle]


def test_text_that_is_not_unicode_never_breaks_the_json() -> None:
    from luftpause.runtime.web.monitor import _json

    response = _json({"runs": [{"name": "ok"}, {"task": "bad \ud800 text"}]})
    assert response.status_code == 200
    assert json.loads(response.body)["runs"][1]["task"] == "bad \ud800 text"
