"""The monitor's polling protocol over HTTP (issue 6 review): ``GET /monitor/runs?version=`` answers
``unchanged`` while the run network stands and builds the network once per version however many
pages poll; ``GET /monitor/runs/{handle}?since=`` sends only the messages the page does not have.

In-process: the monitor's routes in a Starlette app over
:class:`~luftpause.runtime.pods.operations.PodOperations` and a registry without a journal, driven
through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from runtime_helpers import make_run, pods_over
from starlette.applications import Starlette

from luftpause.config import DEFAULT_MODEL, parse_config
from luftpause.runtime.pods.actors import PERSON
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.tenants import Tenant
from luftpause.runtime.web.monitor import monitor_routes

CONFIG = f'[[replicas]]\nname = "r"\nurl = "http://127.0.0.1:1"\nmodels = ["{DEFAULT_MODEL}"]\n'


def _run(handle: str, parent: str | None = None) -> Run:
    return make_run(handle, caller="c", parent=parent)


def test_runs_poll_answers_unchanged_until_the_network_changes_and_builds_once_per_version() -> None:
    pods = pods_over(parse_config(CONFIG))
    builds: list[int] = []
    network = pods.network

    def counted(tenant: Tenant | None = None) -> list[dict[str, Any]]:
        builds.append(1)
        return network(tenant)

    pods.network = counted  # type: ignore[method-assign]
    app = Starlette(routes=monitor_routes(pods))

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:

            async def poll(version: str | None = None) -> dict[str, Any]:
                params = {"version": version} if version is not None else {}
                response = await client.get("/monitor/runs", params=params)
                assert response.status_code == 200, response.text
                return response.json()

            parent = pods.registry.add(_run("run-a"))
            first = await poll()
            assert [r["handle"] for r in first["runs"]] == ["run-a"] and first["version"]
            # Two pages, the same version: one build, and the page that has it gets "unchanged".
            assert await poll() == first
            assert await poll(first["version"]) == {"version": first["version"], "unchanged": True}
            assert len(builds) == 1

            # Each change to the network is a new version: a child, a round, an answer, a stop.
            seen = {first["version"]}
            child = pods.registry.add(_run("run-b", parent="run-a"))
            pods.registry.complete_round(child, [{"role": "assistant", "content": "working"}])
            changes = [
                lambda: None,  # the child added and its round, above
                lambda: pods.registry.finish(child, "completed", answer="done"),
                lambda: pods.stop(PERSON, "run-b"),
                lambda: pods.registry.finish(parent, "failed", error="broke"),
            ]
            last = first["version"]
            for change in changes:
                change()
                now = await poll(last)
                assert not now.get("unchanged") and now["version"] not in seen, now
                seen.add(now["version"])
                last = now["version"]
                assert await poll(last) == {"version": last, "unchanged": True}
            by_handle = {r["handle"]: r for r in now["runs"]}
            assert by_handle["run-b"]["state"] == "stopped" and by_handle["run-b"]["lastAnswer"] == "done"
            assert by_handle["run-a"]["error"] == "broke"
            assert len(builds) == 1 + len(changes)

            # A version from another process (or made up) is never taken as current.
            assert "runs" in await poll("0." + last.split(".")[1])

    asyncio.run(go())


def test_conversation_poll_sends_only_new_messages_after_the_cursor() -> None:
    pods = pods_over(parse_config(CONFIG))
    app = Starlette(routes=monitor_routes(pods))
    run = pods.registry.add(_run("run-c"))

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:

            async def conversation(since: object = None) -> httpx.Response:
                params = {"since": str(since)} if since is not None else {}
                return await client.get("/monitor/runs/run-c", params=params)

            whole = (await conversation()).json()
            assert whole["messages"] == [{"role": "user", "content": "t"}]
            assert (whole["from"], whole["cursor"]) == (0, 1)

            pods.registry.complete_round(
                run, [{"role": "assistant", "content": "one"}, {"role": "user", "content": "more"}]
            )
            new = (await conversation(whole["cursor"])).json()
            assert new["messages"] == [
                {"role": "assistant", "content": "one"},
                {"role": "user", "content": "more"},
            ]
            assert (new["from"], new["cursor"]) == (1, 3)

            nothing = (await conversation(new["cursor"])).json()
            assert (nothing["messages"], nothing["from"], nothing["cursor"]) == ([], 3, 3)

            # A cursor past the conversation (dropped, or from elsewhere): all of it, from 0.
            again = (await conversation(99)).json()
            assert (len(again["messages"]), again["from"], again["cursor"]) == (3, 0, 3)

            bad = await conversation("-1")
            assert bad.status_code == 400 and "since" in bad.json()["error"]["message"]

    asyncio.run(go())
