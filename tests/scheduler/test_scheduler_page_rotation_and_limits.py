"""The scheduler's live page shows what the admin API and the protection limits do, in headless
Chromium: a replica drained and one being removed through the admin API (real processes on
loopback) show ``draining`` and ``removing`` in their row's Rotation cell, and ``in rotation`` once
put back; a caller refused by its held-turn limit (429 through the ``openai`` client) is counted in
the page's Protection limits section. A tripped circuit breaker (open only until the next healthy
probe, 2 s at most: too short to catch in a real stack), many refused callers and limits turned off
are served from small local servers in ``/status``'s shape (:mod:`luftpause.scheduler.core.snapshot`).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import orjson
import pytest
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

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "page-admin-token"
BREAKER_FAILURES = 3


@dataclass
class Drained:
    stack: Stack
    page_url: str
    """The page's address, with the token (``?token=``) that the page sends on its polls."""

    def admin(self, method: str, path: str) -> int:
        """``method`` on the scheduler's admin API with the token; the HTTP status."""
        base = self.stack.status_url.removesuffix("/status")
        bearer = {"authorization": f"Bearer {TOKEN}"}
        request = urllib.request.Request(base + path, method=method, headers=bearer)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drained]:
    """Two replicas of one slot each, both taken by long turns; alice (at most one interactive turn
    held) has one held and one more refused with 429; then sim-0 is drained and sim-1 removed (202:
    it leaves when its turn ends, which is not before the module ends)."""
    limits = (
        f"[scheduler.protection]\nbreaker_failures = {BREAKER_FAILURES}\n"
        "[scheduler.protection.interactive]\nmax_held = 1\n"
    )
    # The token of the whole stack: the scheduler's admin API needs it, and every turn carries it.
    stack = Stack.start(
        tmp_path_factory.mktemp("page-replicas"),
        max_inflight=1,
        decode_ms=50.0,
        scheduler_config=limits,
        env={"LUFTPAUSE_TOKEN": TOKEN},
    )
    clients: list[subprocess.Popen[bytes]] = []
    try:
        url = f"{stack.dataplane_url}/v1/chat/completions"
        body = orjson.dumps(
            {
                "model": stack.model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 100_000,  # 50 ms a token: the slot stays taken for the whole module
                "stream": True,
            }
        ).decode()

        def send(run: str, caller: str) -> None:
            argv = [sys.executable, "-c", STREAM_CLIENT, url, body, run, caller, "interactive", TOKEN]
            clients.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        send("fill-0", "filler")
        send("fill-1", "filler")
        stack.wait_status(lambda s: [r["inflight"] for r in s["replicas"]] == [1, 1])
        send("alice-0", "alice")
        stack.wait_status(lambda s: s["held"]["by_caller"].get("alice") == 1)
        alice = openai.OpenAI(
            base_url=f"{stack.dataplane_url}/v1",
            api_key=TOKEN,
            max_retries=0,
            default_headers={"x-luftpause-caller": "alice"},
        )
        with alice, pytest.raises(openai.RateLimitError):
            alice.chat.completions.create(
                model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        running = Drained(stack, stack.status_url.removesuffix("status") + f"?token={TOKEN}")
        assert running.admin("POST", "/admin/replicas/sim-0/drain") == 200
        assert running.admin("DELETE", "/admin/replicas/sim-1") == 202  # its turn is still in flight
        changed = stack.wait_status(lambda s: s["replicas"][0]["draining"] and s["replicas"][1]["removing"])
        assert changed["replicas"][0]["draining"] and changed["replicas"][1]["removing"], changed
        yield running
    finally:
        for proc in clients:
            proc.kill()
            proc.wait()
        stack.stop()


def _replica_rows(dom: Element) -> dict[str, Element]:
    table = by_id(dom, "replicas")
    return {row.attrs["data-replica"]: row for row in table.find_all("tr") if "data-replica" in row.attrs}


def test_a_replica_drained_or_removed_through_the_admin_api_says_so_on_the_page(drained: Drained) -> None:
    dom = dump_dom(drained.page_url)
    assert poll_state(dom) == "ok"
    rows = _replica_rows(dom)
    assert rows["sim-0"].cell("rotation") == "draining"
    assert rows["sim-0"].one("td", data_rotation="draining")
    assert "runs pinned there" in rows["sim-0"].one("span", **{"class": "badge rot-draining"}).attrs["title"]
    assert rows["sim-1"].cell("rotation") == "removing"
    assert by_id(dom, "replicas-summary").text().endswith("· 1 draining · 1 removing")


def test_a_refusal_by_a_protection_limit_is_counted_on_the_page(drained: Drained) -> None:
    limits = drained.stack.status()["limits"]
    assert limits["refused"] == {"held": 1, "queue_timeout": 0, "token_rate": 0}, limits
    dom = dump_dom(drained.page_url)
    section = by_id(dom, "limits-section")
    assert "hidden" not in section.attrs and "hidden" not in by_id(dom, "limits-refusals").attrs
    summary = by_id(dom, "limits-summary").text()
    assert summary == f"circuit breaker after {BREAKER_FAILURES} failed turns in a row"
    refused = [by_id(dom, f"refused-{reason}").text() for reason in ("held", "queue_timeout", "token_rate")]
    assert refused == ["1", "0", "0"]
    interactive = by_id(dom, "refused-by-class").one("tr", data_class="interactive")
    counts = [interactive.cell(reason) for reason in ("held", "queue_timeout", "token_rate")]
    assert counts == ["1", "0", "0"]
    assert by_id(dom, "refused-by-caller").one("tr", data_caller="alice").cell("count") == "1"


def test_a_replica_put_back_through_the_admin_api_is_in_rotation_again(drained: Drained) -> None:
    assert drained.admin("POST", "/admin/replicas/sim-0/restore") == 200
    assert drained.admin("POST", "/admin/replicas/sim-1/restore") == 200
    drained.stack.wait_status(lambda s: not any(r["draining"] or r["removing"] for r in s["replicas"]))
    rows = _replica_rows(dump_dom(drained.page_url))
    assert rows["sim-0"].cell("rotation") == rows["sim-1"].cell("rotation") == "in rotation"


# -- /status answers served from a local server ---------------------------------------------------------


@pytest.fixture
def serve() -> Iterator[Callable[[dict[str, Route]], RoutesServer]]:
    with routes_servers() as start:
        yield start


def _replica(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name, "kind": "generative", "models": ["m"], "inflight": 0, "capacity": 4,
        "effective_capacity": 4, "batch_capacity": None, "reserved_headroom": 0, "leased": 0,
        "healthy": True, "draining": False, "removing": False, "tripped": False,
        "failures_in_a_row": 0, "probed_s_ago": 1.0, "running": 0, "waiting": 0, **fields,
    }  # fmt: skip


def _limits(**fields: Any) -> dict[str, Any]:
    return {
        "on": True, "breaker_failures": 0,
        "refused": {"held": 0, "queue_timeout": 0, "token_rate": 0},
        "refused_by_class": {}, "refused_by_caller": {}, "token_buckets": {}, **fields,
    }  # fmt: skip


def _dump(serve: Callable[[dict[str, Route]], RoutesServer], status: dict[str, Any]) -> Element:
    scheduler = serve({"/": PAGE_ROUTE, "/status": json_route({**EMPTY_STATUS, **status})})
    dom = dump_dom(f"{scheduler.url}/")
    assert poll_state(dom) == "ok"
    return dom


def test_a_tripped_breaker_and_failures_in_a_row_are_shown_per_replica(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    replicas = [
        _replica("open", healthy=True, tripped=True, failures_in_a_row=3),
        _replica("shaky", failures_in_a_row=1),
        _replica("trial", breaker="half_open"),
        _replica("both", draining=True, tripped=True, failures_in_a_row=3),
        {k: v for k, v in _replica("older").items() if k not in ("draining", "removing", "tripped")},
    ]
    dom = _dump(serve, {"replicas": replicas, "limits": _limits(on=False, breaker_failures=3)})
    rows = _replica_rows(dom)
    assert rows["open"].one("td", data_rotation="breaker open")
    assert rows["open"].cell("failures") == "3 failed in a row (breaker at 3)"
    title = rows["open"].one("span", **{"class": "badge rot-open"}).attrs["title"]
    assert "until a healthy probe" in title and "after 3 failed turns in a row" in title
    assert rows["shaky"].one("td", data_rotation="in rotation")
    assert rows["shaky"].cell("failures") == "1 failed in a row (breaker at 3)"
    assert rows["both"].one("td", data_rotation="draining, breaker open")
    assert rows["trial"].one("td", data_rotation="breaker half-open")  # it takes trial turns only
    assert rows["older"].cell("rotation") == DASH  # a scheduler from before the admin API
    assert by_id(dom, "replicas-summary").text().endswith("· 1 draining · 2 breaker open")
    # the breaker alone: the section says so, and shows no refusals (no limit can refuse)
    assert "hidden" not in by_id(dom, "limits-section").attrs
    assert by_id(dom, "limits-refusals").attrs.get("hidden") is not None
    assert by_id(dom, "limits-summary").text() == (
        "no held, queue-timeout or token-rate limit set · circuit breaker after 3 failed turns in a row"
    )


def test_with_no_limit_and_no_breaker_the_limits_section_is_hidden(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    dom = _dump(serve, {"replicas": [_replica("a")], "limits": _limits(on=False)})
    assert by_id(dom, "limits-section").attrs.get("hidden") is not None
    assert _replica_rows(dom)["a"].cell("rotation") == "in rotation"
    older = _dump(serve, {})  # no "limits" at all
    assert by_id(older, "limits-section").attrs.get("hidden") is not None


def test_refusals_by_caller_are_listed_most_first_with_their_token_buckets(
    serve: Callable[[dict[str, Route]], RoutesServer],
) -> None:
    by_caller = {f"caller-{i:02d}": i for i in range(1, 26)} | {"*": 30, "": 3}
    limits = _limits(
        refused={"held": 2, "queue_timeout": 5, "token_rate": 400},
        refused_by_class={"batch": {"token_rate": 400, "queue_timeout": 5}, "interactive": {"held": 2}},
        refused_by_caller=by_caller,
        token_buckets={"caller-25": {"batch": 1234.5}, "quiet": {"interactive": 0.4}},
    )
    dom = _dump(serve, {"limits": limits})
    assert by_id(dom, "limits-summary").text() == "no circuit breaker"
    assert by_id(dom, "refused-token_rate").text() == "400"
    batch = by_id(dom, "refused-by-class").one("tr", data_class="batch")
    assert (batch.cell("held"), batch.cell("queue_timeout"), batch.cell("token_rate")) == ("0", "5", "400")
    table = by_id(dom, "refused-by-caller")
    callers = [row.attrs["data-caller"] for row in table.find_all("tr") if "data-caller" in row.attrs]
    assert callers[:3] == ["*", "caller-25", "caller-24"] and len(callers) == 20
    assert "quiet" not in callers and "" not in callers  # 3 refused and none: below the 20 shown
    assert table.one("tr", data_caller="*").cell("anon") == "(every other caller)"
    assert table.one("tr", data_caller="caller-25").cell("bucket") == "batch 1,234"
    assert table.one("tr", data_caller="caller-24").cell("bucket") == DASH
    assert table.find_all("tr", **{"class": "empty"})[0].text() == "… 8 more callers"
