"""The scheduler's live page (``GET /``) in headless Chromium, against real processes on loopback.

A stack (scheduler, dataplane, runtime, two simulated engines) is saturated: one replica slot each,
filled by long streamed turns, then turns of two named callers (one per service class), a caller
whose name is markup, and two runtime sub-agents are held behind them. Chromium loads the page,
runs its script for a few seconds of virtual time and dumps the DOM, which is parsed here and
compared with the scheduler's own ``/status``. Run trees of the shape the runtime is growing
(``parent``, ``children``, ``own``, ``subtree``), a refused token and a failing poll are served by
small local servers. Chromium must be installed (``/usr/bin/chromium``): without it these tests
fail, they are never skipped.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from page_helpers import (
    DASH,
    EMPTY_STATUS,
    PAGE_ROUTE,
    STREAM_CLIENT,
    Element,
    Route,
    RoutesServer,
    by_id,
    dump_dom,
    json_route,
    poll_state,
    routes_servers,
)

from luftpause.scheduler.status_http import page_html
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

HOSTILE_CALLER = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
TOKEN = "page-test-token"

# -- a saturated stack -------------------------------------------------------------------------------


@dataclass
class Saturated:
    stack: Stack
    page_url: str
    runtime_base: str
    handles: list[str]
    status: dict[str, Any]


def held_by_caller(status: dict[str, Any]) -> dict[str, int]:
    by_caller: dict[str, int] = status["held"]["by_caller"]
    return by_caller


@pytest.fixture(scope="module")
def saturated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saturated]:
    """Two replicas of one slot each, both taken by long turns; held behind them: alice 2
    interactive, bob 2 batch, the markup caller 1 interactive, and the turns of two runtime runs."""
    stack = Stack.start(tmp_path_factory.mktemp("page-stack"), max_inflight=1, decode_ms=50.0)
    clients: list[subprocess.Popen[bytes]] = []
    try:
        body = orjson.dumps(
            {
                "model": stack.model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 100_000,  # 50 ms a token: the slot stays taken for the whole module
                "stream": True,
            }
        ).decode()
        url = f"{stack.dataplane_url}/v1/chat/completions"

        def send(run: str, caller: str, service_class: str) -> None:
            clients.append(
                subprocess.Popen(
                    [sys.executable, "-c", STREAM_CLIENT, url, body, run, caller, service_class],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        stack.wait_connected()
        send("fill-0", "filler", "interactive")
        send("fill-1", "filler", "interactive")
        full = stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 2)
        assert [r["inflight"] for r in full["replicas"]] == [1, 1], full
        for i in range(2):
            send(f"alice-{i}", "alice", "interactive")
            send(f"bob-{i}", "bob", "batch")
        send("hostile-0", HOSTILE_CALLER, "interactive")

        async def spawn_two() -> list[str]:
            async with Client(stack.runtime_url) as client:
                handles = []
                for topic in ("tides", "glaciers"):
                    result = await client.call_tool("spawn", {"task": f"Find two facts about {topic}."})
                    assert not result.is_error, result
                    handles.append(result.structured_content["handle"])
                return handles

        handles = asyncio.run(spawn_two())
        status = stack.wait_status(
            # 7 held, and every replica probed since its filler turn reached the engine (a probe
            # from before says running 0, and the next one would change it between the page's dump
            # and the status a test compares it with)
            lambda s: (
                s["held"]["count"] == 7 and all(r["running"] == r["inflight"] == 1 for r in s["replicas"])
            )
        )
        assert status["held"]["count"] == 7, status
        assert held_by_caller(status)["alice"] == 2 and held_by_caller(status)["bob"] == 2, status
        page_url = stack.status_url.removesuffix("status")
        runtime_base = stack.runtime_url.removesuffix("/mcp")
        yield Saturated(stack, page_url, runtime_base, handles, status)
    finally:
        for client in clients:
            client.kill()
            client.wait()
        stack.stop()


@pytest.fixture(scope="module")
def page(saturated: Saturated) -> Element:
    """The page over the saturated pool, with ``?runtime=`` pointing at the stack's runtime."""
    query = urllib.parse.urlencode({"runtime": saturated.runtime_base})
    return dump_dom(f"{saturated.page_url}?{query}")


# -- tests: the scheduler's side ---------------------------------------------------------------------


def test_the_page_is_served_with_a_policy_that_runs_only_its_own_script(saturated: Saturated) -> None:
    with urllib.request.urlopen(saturated.page_url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        csp = response.headers["Content-Security-Policy"]
        body = response.read()
    assert body == page_html()
    assert "script-src 'sha256-" in csp and "unsafe-inline" not in csp
    assert "default-src 'none'" in csp


def test_the_page_shows_a_row_per_replica_with_its_load(page: Element, saturated: Saturated) -> None:
    assert poll_state(page) == "ok", by_id(page, "poll").text()
    assert "updated" in by_id(page, "poll").text()
    rows = by_id(page, "replicas").find_all("tr", data_replica="sim-0") + by_id(page, "replicas").find_all(
        "tr", data_replica="sim-1"
    )
    assert len(rows) == 2
    status = saturated.stack.status()
    for row, replica in zip(rows, status["replicas"], strict=True):
        assert row.attrs["data-replica"] == replica["name"]
        assert "healthy" in row.text()
        assert row.cell("inflight").startswith(f"{replica['inflight']} / {replica['effective_capacity']}")
        assert "saturated" in row.cell("inflight")
        assert row.cell("running") == str(replica["running"])
        assert row.cell("waiting") == str(replica["waiting"])
        assert row.cell("headroom") == str(replica["reserved_headroom"])


def test_the_page_shows_each_dataplane_with_its_turns(page: Element, saturated: Saturated) -> None:
    (dataplane,) = saturated.stack.status()["dataplanes"]
    row = by_id(page, "dataplanes").one("tr", data_dataplane=dataplane["id"])
    assert row.cell("link") == "connected"
    # the held turns (7) and the two fillers in flight all came through this one dataplane
    assert (row.cell("inflight"), row.cell("held")) == ("2", "7")
    assert int(row.cell("turns")) >= 9
    assert row.cell("seen").endswith(" ago")
    assert by_id(page, "dataplanes-summary").text().startswith("1 of 1 connected")


def test_the_page_shows_held_turns_per_class_and_per_caller(page: Element, saturated: Saturated) -> None:
    held = saturated.status["held"]
    assert by_id(page, "held-count").text() == "7"
    classes = by_id(page, "held-by-class")
    assert classes.one("tr", data_class="interactive").cell("count") == str(held["by_class"]["interactive"])
    assert classes.one("tr", data_class="batch").cell("count") == "2"
    assert held["by_class"]["interactive"] == 5  # alice 2, the markup caller 1, the two runs
    callers = by_id(page, "held-by-caller")
    assert callers.one("tr", data_caller="alice").cell("count") == "2"
    assert callers.one("tr", data_caller="bob").cell("count") == "2"
    for caller, count in held["by_caller"].items():
        row = callers.one("tr", data_caller=caller)
        assert row.cell("count") == str(count)
        assert row.cell("wait").endswith(" s"), row.text()  # an oldest wait, in seconds


def test_the_page_shows_runs_by_phase_and_class(page: Element, saturated: Saturated) -> None:
    status = saturated.stack.status()
    phases = by_id(page, "runs-by-phase")
    for phase, count in status["runs"].items():
        assert phases.one("tr", data_key=phase).cell("count") == str(count)
    classes = by_id(page, "runs-by-class")
    for service_class, count in status["runs_by_class"].items():
        assert classes.one("tr", data_key=service_class).cell("count") == str(count)
    assert status["runs_by_class"]["batch"] == 2


def test_a_caller_named_with_markup_is_shown_as_text(page: Element) -> None:
    row = by_id(page, "held-by-caller").one("tr", data_caller=HOSTILE_CALLER)
    assert HOSTILE_CALLER in row.text()
    assert len(page.find_all("script")) == 2  # the pages' shared one and its own
    assert page.find_all("img") == []
    assert page.one("title").text() == "luftpause scheduler"


def test_with_runtime_the_page_shows_the_runtimes_runs(page: Element, saturated: Saturated) -> None:
    section = by_id(page, "runtime-section")
    assert "hidden" not in section.attrs
    assert by_id(page, "runtime-notice").one("div").attrs["data-notice"] == "info"
    with urllib.request.urlopen(f"{saturated.runtime_base}/status", timeout=10) as response:
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        listed = {run.get("id") or run["handle"]: run for run in orjson.loads(response.read())["runs"]}
    rows = by_id(page, "runtime-runs")
    for handle in saturated.handles:
        row = rows.one("tr", data_run=handle)
        assert row.attrs["data-state"] == "running"
        assert row.attrs["data-depth"] == "0"
        assert "Find two facts about" in row.cell("task")
        # Own costs are a run's flat counters or its "own" object; no "subtree" object, a dash.
        run = listed[handle]
        own = run["own"]["turns"] if isinstance(run.get("own"), dict) else run["turns"]
        subtree = run["subtree"]["turns"] if isinstance(run.get("subtree"), dict) else DASH
        assert row.cell("turns") == f"{own} / {subtree}"


# -- tests: run trees, tokens and failures, from small local servers ----------------------------------


@pytest.fixture
def serve() -> Iterator[Callable[[dict[str, Route]], RoutesServer]]:
    with routes_servers() as start:
        yield start


TREE = {
    "runs": [
        {
            "id": "root",
            "state": "running",
            "parent": None,
            "children": ["child-a", "<b>child-b</b>"],
            "own": {
                "turns": 2,
                "toolCalls": 3,
                "failedToolCalls": 1,
                "promptTokens": 100,
                "completionTokens": 20,
                "turnSeconds": 1.5,
                "toolSeconds": 0.5,
            },
            "subtree": {
                "turns": 9,
                "toolCalls": 11,
                "promptTokens": 900,
                "completionTokens": 300,
                "turnSeconds": 10.0,
                "toolSeconds": 2.0,
            },
        },
        {
            "id": "child-a",
            "state": "completed",
            "parent": "root",
            "children": ["grandchild"],
            "own": {"turns": 4},
            "subtree": {"turns": 6},
        },
        {"id": "grandchild", "state": "failed", "parent": "child-a", "children": []},
        {"id": "<b>child-b</b>", "state": "<i>odd</i>", "parent": "root"},
        {"id": "orphan", "parent": "gone", "own": "not an object", "subtree": None},
    ]
}


def test_the_run_tree_nests_children_under_parents_with_own_and_subtree_costs(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    scheduler = serve({"/": PAGE_ROUTE, "/status": json_route(EMPTY_STATUS)})
    runtime = serve({"/status": json_route(TREE)})
    dom = dump_dom(f"{scheduler.url}/?runtime={urllib.parse.quote(runtime.url)}")
    rows = [r for r in by_id(dom, "runtime-runs").iter() if r.tag == "tr" and "data-run" in r.attrs]
    order = [(r.attrs["data-run"], r.attrs["data-depth"]) for r in rows]
    assert order == [
        ("root", "0"),
        ("child-a", "1"),
        ("grandchild", "2"),
        ("<b>child-b</b>", "1"),
        ("orphan", "0"),
    ]
    root, child_a, grandchild, child_b, orphan = rows
    assert root.cell("turns") == "2 / 9"
    assert root.cell("tools") == "3 / 11"
    assert root.cell("tokens") == "120 / 1,200"
    assert root.cell("time") == "2.0 s / 12 s"  # turn time and tool time together
    assert child_a.cell("turns") == "4 / 6"
    assert child_a.cell("tokens") == f"{DASH} / {DASH}"
    assert grandchild.cell("time") == f"{DASH} / {DASH}"
    assert "<b>child-b</b>" in child_b.text() and "<i>odd</i>" in child_b.text()
    assert dom.find_all("b") == [] and dom.find_all("i") == []
    assert "parent gone not listed" in orphan.text()
    assert orphan.cell("turns") == f"{DASH} / {DASH}"
    assert poll_state(dom) == "ok"


def test_a_runtime_that_refuses_the_token_is_named_on_the_page(tmp_path: Path) -> None:
    """A real runtime with ``LUFTPAUSE_TOKEN``: its 401 (after the CORS preflight the bearer header
    causes) is shown; the right token gets its (empty) run list."""
    rt_port, status_port = free_port(), free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{free_port()}"\nhttp = "127.0.0.1:{status_port}"\n\n'
        f'[runtime]\nlisten = "127.0.0.1:{rt_port}"\ndataplane = "http://127.0.0.1:1"\n'
        f'state_dir = "{tmp_path / "state"}"\n\n'
        '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nhealth_path = ""\nmodels = ["m"]\n'
    )
    children = [
        ChildProcess(
            "runtime",
            ["runtime", "--config", str(config)],
            tmp_path / "runtime.log",
            env={"LUFTPAUSE_TOKEN": TOKEN},
            ready_url=f"http://127.0.0.1:{rt_port}/health",
        ),
        ChildProcess(
            "scheduler",
            ["scheduler", "--config", str(config)],
            tmp_path / "scheduler.log",
            ready_url=f"http://127.0.0.1:{status_port}/health",
        ),
    ]
    try:
        for child in children:
            child.start()
            child.wait_ready()
        page = f"http://127.0.0.1:{status_port}/?runtime=http://127.0.0.1:{rt_port}"
        for query, expected in [("", "needs its LUFTPAUSE_TOKEN"), ("&token=wrong", "refused the token")]:
            notice = by_id(dump_dom(page + query), "runtime-notice").one("div")
            assert notice.attrs["data-notice"] == "error"
            assert "401" in notice.text() and expected in notice.text(), notice.text()
        dom = dump_dom(f"{page}&token={TOKEN}")
        assert by_id(dom, "runtime-notice").one("div").attrs["data-notice"] == "info"
        assert "no runs on this runtime" in by_id(dom, "runtime-runs").text()
    finally:
        for child in children:
            child.stop()


def test_the_page_sends_its_token_to_a_scheduler_that_needs_one(tmp_path: Path) -> None:
    """A scheduler with ``LUFTPAUSE_TOKEN`` answers ``/status`` only with it: the page, open
    itself, sends its ``?token=`` (kept for the tab) and says when it is missing or refused."""
    status_port = free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{free_port()}"\nhttp = "127.0.0.1:{status_port}"\n\n'
        '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nhealth_path = ""\nmodels = ["m"]\n'
    )
    scheduler = ChildProcess(
        "scheduler",
        ["scheduler", "--config", str(config)],
        tmp_path / "scheduler.log",
        env={"LUFTPAUSE_TOKEN": TOKEN},
        ready_url=f"http://127.0.0.1:{status_port}/health",
    )
    try:
        scheduler.start().wait_ready()
        page = f"http://127.0.0.1:{status_port}/"
        for query, expected in [("", "needs its LUFTPAUSE_TOKEN"), ("?token=wrong", "refused the token")]:
            dom = dump_dom(page + query)
            assert poll_state(dom) == "error"
            text = by_id(dom, "poll").text()
            assert "401" in text and expected in text, text
        dom = dump_dom(f"{page}?token={TOKEN}")
        assert poll_state(dom) == "ok", by_id(dom, "poll").text()
        assert TOKEN not in json.dumps(dom.text())
    finally:
        scheduler.stop()


def test_a_failed_poll_is_shown_with_when_data_was_last_good(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    answers = iter([json_route(EMPTY_STATUS)])

    def status(headers: dict[str, str]) -> tuple[int, str, bytes]:
        return next(answers, (500, "application/json", b'{"error":{"message":"internal error: Boom"}}'))

    scheduler = serve({"/": PAGE_ROUTE, "/status": status})
    dom = dump_dom(f"{scheduler.url}/", budget_ms=5000)
    assert poll_state(dom) == "error"
    text = by_id(dom, "poll").text()
    assert "poll failed" in text and "500" in text and "internal error: Boom" in text
    assert "showing data from" in text
    assert "stale" in by_id(dom, "main").attrs.get("class", "")


def test_a_page_that_never_reached_the_scheduler_says_so(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    scheduler = serve({"/": PAGE_ROUTE})  # /status: 404
    dom = dump_dom(f"{scheduler.url}/")
    assert poll_state(dom) == "error"
    assert "no data yet" in by_id(dom, "poll").text()


def _fill_width(row: Element) -> float:
    """The width (percent of the bar) of a replica row's in-flight fill."""
    (fill,) = [e for e in row.iter() if "fill" in e.attrs.get("class", "").split()]
    match = re.search(r"width:\s*([0-9.]+)%", fill.attrs.get("style", ""))
    assert match is not None, fill.attrs
    return float(match.group(1))


CAPPED_STATUS: dict[str, Any] = {
    **EMPTY_STATUS,
    "replicas": [
        # the review's input: 19 in flight beside 4 effective (a queue), 32 configured
        {"name": "a", "kind": "generative", "models": ["m"], "inflight": 19, "capacity": 32,
         "effective_capacity": 4, "batch_capacity": 4, "reserved_headroom": 0, "leased": 0,
         "healthy": True, "probed_s_ago": 1.0, "running": 4, "waiting": 15},
        {"name": "b", "kind": "generative", "models": ["m"], "inflight": 2, "capacity": 32,
         "effective_capacity": 8, "batch_capacity": None, "reserved_headroom": 0, "leased": 3,
         "healthy": True, "probed_s_ago": 1.0, "running": 2, "waiting": 0},
    ],
    "leases": {"dp-1": {"b": 2}, "dp-2": {"b": 1}},
    "runs_by_caller": {"ide": 4, "bulk": 24},
    "inflight_by_caller": {"bulk": 19, "ide": 2},
}  # fmt: skip


def test_in_flight_is_drawn_against_effective_capacity_with_leases_and_callers(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    scheduler = serve({"/": PAGE_ROUTE, "/status": json_route(CAPPED_STATUS)})
    dom = dump_dom(f"{scheduler.url}/")
    replicas = by_id(dom, "replicas")
    a, b = replicas.one("tr", data_replica="a"), replicas.one("tr", data_replica="b")
    assert a.cell("inflight").startswith("19 / 4")
    assert _fill_width(a) == 100.0, "19 of 4 is a full bar, not 19 of 32"
    assert "of 32 configured" in a.cell("capnote")
    assert "engine runs 4 at once" in a.cell("capnote")
    assert b.cell("inflight").startswith("2 / 8")
    assert _fill_width(b) == 25.0  # 2 of 8 effective
    assert b.cell("count") == "3"  # leased, unused
    assert b.one(data_dataplane="dp-1").text() == "dp-1: 2"
    assert b.one(data_dataplane="dp-2").text() == "dp-2: 1"
    assert a.cell("count") == "0"
    callers = by_id(dom, "runs-by-caller")
    order = [r.attrs["data-caller"] for r in callers.find_all("tr") if "data-caller" in r.attrs]
    assert order == ["bulk", "ide"]  # most turns in flight first
    assert callers.one("tr", data_caller="ide").cell("runs") == "4"
    assert callers.one("tr", data_caller="ide").cell("inflight") == "2"
    assert callers.one("tr", data_caller="bulk").cell("inflight") == "19"
    assert by_id(dom, "startup-hold").attrs.get("hidden") is not None


def test_a_replica_whose_load_is_unknown_says_so_and_why(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    # issue 13: llama-server's load read as nothing showed dashes, as if the engine were idle
    why = "GET http://127.0.0.1:1/metrics answered 404"
    unknown = {**CAPPED_STATUS["replicas"][1], "running": None, "waiting": None, "load_unknown": why}
    known = {**CAPPED_STATUS["replicas"][0], "load_metrics": "llama.cpp", "load_unknown": None}
    status = {**CAPPED_STATUS, "replicas": [known, unknown]}
    scheduler = serve({"/": PAGE_ROUTE, "/status": json_route(status)})
    dom = dump_dom(f"{scheduler.url}/")
    replicas = by_id(dom, "replicas")
    a, b = replicas.one("tr", data_replica="a"), replicas.one("tr", data_replica="b")
    assert (b.cell("running"), b.cell("waiting")) == ("unknown", "unknown")
    assert [td.attrs["title"] for td in b.find_all("td", data_load="unknown")] == [why, why]
    assert "load unknown: capped by max_inflight only" in b.cell("capnote")
    assert (a.cell("running"), a.cell("waiting")) == ("4", "15")
    assert "load from llama.cpp metrics" in a.cell("capnote")


def test_the_startup_hold_is_shown_while_it_holds(serve: Callable[[dict[str, Route]], RoutesServer]) -> None:
    status = {**EMPTY_STATUS, "startup_hold_s": 1.5}
    scheduler = serve({"/": PAGE_ROUTE, "/status": json_route(status)})
    dom = dump_dom(f"{scheduler.url}/")
    hold = by_id(dom, "startup-hold")
    assert "hidden" not in hold.attrs
    assert "startup hold" in hold.text()


# -- the last minutes, drawn in a real browser and read back from its screenshot ----------------------


def test_the_last_minutes_are_drawn_from_the_schedulers_series(saturated: Saturated, tmp_path: Path) -> None:
    """The held turns of the saturated pool, sampled every 2 s: the page's held-turns chart draws
    them per class (its legend says the newest sample's counts), and the screenshot of the chart
    (``scheduler-chart-held.png``, beside ``scheduler.png``, in the test's tmp dir) has both classes'
    line colours in it. The runtime's runs are named in the shared words (``running``)."""
    import aiohttp
    from browser_helpers import colour_share, devtools_browser, open_page, png_size
    from pods_helpers import until

    series_url = saturated.page_url + "series"

    def held_samples() -> list[dict[str, Any]]:
        with urllib.request.urlopen(series_url, timeout=10) as response:
            samples: list[dict[str, Any]] = orjson.loads(response.read())["samples"]
        return [s for s in samples if s["held"] == {"interactive": 5, "batch": 2}]

    async def go() -> None:
        async def sampled() -> bool:
            return len(await asyncio.to_thread(held_samples)) >= 3

        await until(sampled, "three samples of the 7 held turns", seconds=60)
        query = urllib.parse.urlencode({"runtime": saturated.runtime_base})
        with devtools_browser(tmp_path, (1280, 1500)) as port:
            async with aiohttp.ClientSession() as session:
                page = await open_page(port, f"{saturated.page_url}?{query}", session)
                try:
                    batch = '#chart-held polyline[data-series="batch"]'

                    async def drawn() -> bool:
                        return await page.drawn_points(batch) >= 3

                    await until(drawn, "the batch line of the held-turns chart")
                    legend = (await page.text("#chart-held .legend")).replace(" ", "")
                    assert "interactive5" in legend and "batch2" in legend, legend
                    for handle in saturated.handles:
                        row = f'#runtime-runs tr[data-run="{handle}"] .badge'
                        await until(lambda row=row: page.center(row), "the runtime's runs")
                        assert await page.text(row) == "running"
                    whole = await page.screenshot(tmp_path / "scheduler.png")
                    chart = await page.screenshot(tmp_path / "scheduler-chart-held.png", "#chart-held svg")
                finally:
                    await page.ws.close()
        assert png_size(whole)[0] >= 1000
        assert colour_share(chart, "#3b82f6") > 0.0005  # interactive: 20 pixels or more
        assert colour_share(chart, "#d68a00") > 0.0005  # batch
        assert colour_share(whole, "#18202c") > 0.01  # the header bar both pages share

    asyncio.run(go())
