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
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from browser_helpers import Page, colour_share, devtools_browser, open_page, png_size
from pods_helpers import Pod, call, script, start_pod, until

from luftpause.testkit.commands.loadgen import runtime_client

pytestmark = pytest.mark.integration

TOKEN = "monitor-test-token"


@pytest.fixture()
def pod(tmp_path: Path) -> Iterator[Pod]:
    with start_pod(tmp_path, token=TOKEN) as running:
        yield running


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[int]:
    """Headless Chromium with its DevTools port; killed afterwards."""
    with devtools_browser(tmp_path) as port:
        yield port


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
                # c had answered: it stays "completed", now tagged stopped (it takes no more messages)
                await until(lambda: _stopped_shown(page, node), "c stopped on the page")
                assert await page.text(node + " .state") == "completed"
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
    child = script({"refuse": 500, "error": "engine sim-a: overloaded"})
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


def test_the_token_box_appears_when_the_runtime_asks_for_its_token(pod: Pod, browser: int) -> None:
    # It was on the page whether or not the runtime needed a token (it needs none by default);
    # now the page offers it once the runtime answers 401. (Without a token, never:
    # test_monitor_long_tree.py.)
    async def token_box_shown(page: Page) -> bool:
        shown = "getComputedStyle(document.getElementById('token-form')).display !== 'none'"
        return bool(await page.evaluate(shown))

    async def go() -> None:
        async with runtime_client(f"{pod.url}/mcp", TOKEN) as client, aiohttp.ClientSession() as session:
            handle = (await call(client, "spawn", task=script({"say": "hello"}), name="greeter"))["handle"]
            page = await open_page(browser, f"{pod.url}/monitor", session)  # no ?token=
            try:
                await until(lambda: token_box_shown(page), "the token box")
                assert "needs its token (LUFTPAUSE_TOKEN)" in await page.text("#notice")
                assert await page.evaluate("document.activeElement.id") == "token"
                await page.click("#token")
                await page.type(TOKEN)
                await page.click("#token-form button")
                card = f'li[data-handle="{handle}"] .run'
                await until(lambda: page.center(card), "the runs, with the token")

                async def box_gone() -> bool:
                    return not await token_box_shown(page)

                await until(box_gone, "the token box gone once the token works")
                assert await page.evaluate("document.getElementById('notice').hidden") is True
            finally:
                await page.ws.close()

    asyncio.run(go())


async def _action_says(page: Page, text: str) -> bool:
    return text in await page.text("#action-result")


async def _shows(page: Page, text: str) -> bool:
    return text in await page.text("#conversation")


async def _state_shown(page: Page, selector: str, state: str) -> bool:
    """A badge of run state ``state`` (its class: ``st-`` and the state) shown in ``selector``."""
    return bool(
        await page.evaluate(f"!!document.querySelector({json.dumps(selector + ' .state.st-' + state)})")
    )


async def _stopped_shown(page: Page, selector: str) -> bool:
    return bool(await page.evaluate(f"!!document.querySelector({json.dumps(selector + ' .tag-stopped')})"))


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


def _series(pod: Pod) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{pod.url}/monitor/series", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        series: dict[str, Any] = json.loads(response.read())
        return series


def test_the_monitor_draws_the_last_minutes_and_says_completed_not_idle(
    pod: Pod, browser: int, tmp_path: Path
) -> None:
    """Runs that answered and one that failed: the tree says ``completed`` and ``failed`` (the
    words the scheduler's page uses), and the charts draw the runtime's samples of runs by state.
    The screenshot (``monitor.png`` and the chart's own, in the test's tmp dir) is read back: the
    finished-runs chart has the completed and the failed lines' colours in it."""
    answered = [script({"say": f"answer {i}"}) for i in range(2)]
    broken = script({"refuse": 500, "error": "engine sim-a: overloaded"})

    async def go() -> None:
        async with runtime_client(f"{pod.url}/mcp", TOKEN) as client, aiohttp.ClientSession() as session:
            handles = [(await call(client, "spawn", task=task))["handle"] for task in [*answered, broken]]

            async def all_ended() -> bool:
                runs = [(await call(client, "status", handle=h))["run"] for h in handles]
                return all(run["state"] != "running" for run in runs)

            await until(all_ended, "the three runs to end")

            def sampled() -> bool:
                samples = _series(pod)["samples"]
                ended = [s for s in samples if s["runs"]["completed"] == 2 and s["runs"]["failed"] == 1]
                return len(samples) >= 3 and len(ended) >= 2

            async def enough_samples() -> bool:
                return await asyncio.to_thread(sampled)

            await until(enough_samples, "samples of the ended runs", seconds=60)
            assert _request(pod, "GET", "/monitor/series")[0] == 401  # the token, as /monitor/runs
            assert _request(pod, "GET", "/monitor/series?after=x", Authorization=f"Bearer {TOKEN}")[0] == 400
            page = await open_page(browser, f"{pod.url}/monitor?token={TOKEN}", session)
            try:
                completed = '#chart-finished polyline[data-series="completed"]'

                async def drawn() -> bool:
                    return await page.drawn_points(completed) >= 3

                await until(drawn, "the completed runs' line with its samples")
                for handle in handles[:2]:
                    assert await page.text(f'li[data-handle="{handle}"] .state') == "completed"
                assert await page.text(f'li[data-handle="{handles[2]}"] .state') == "failed"
                assert "idle" not in await page.text("#roots")
                legend = await page.text("#chart-finished .legend")
                assert "completed2" in legend.replace(" ", "") and "failed1" in legend.replace(" ", "")
                assert "runs: 2 completed, 1 failed" in await page.text("#runs-summary")
                whole = await page.screenshot(tmp_path / "monitor.png")
                chart = await page.screenshot(tmp_path / "monitor-chart-finished.png", "#chart-finished svg")
            finally:
                await page.ws.close()
        width, height = png_size(whole)
        assert width >= 1000 and height >= 600
        assert png_size(chart)[0] >= 250
        assert colour_share(chart, "#1f9d55") > 0.0005  # the completed line (20 pixels or more)
        assert colour_share(chart, "#d64545") > 0.0005  # the failed line
        assert colour_share(whole, "#18202c") > 0.02  # the scheduler page's header bar

    asyncio.run(go())
