"""What one monitor poll costs with 10,000 retained runs (issue 6 review): a measurement script,
not a test (no figure is asserted).

Builds a run registry in-process with ``--runs`` finished runs (a tree: every tenth run a parent
of the nine after it), each with a short conversation, and drives the monitor's routes through
httpx's ASGI transport, as a page does each second:

* ``GET /monitor/runs`` after a change (the network is built and encoded once for that version),
* ``GET /monitor/runs`` again at the same version by another page (served from the cache),
* ``GET /monitor/runs?version=V`` by a page that has the current version (``unchanged``),
* ``GET /monitor/runs/{handle}`` of a run with a long conversation, then ``?since=<cursor>``.

Prints the median time (milliseconds on the event loop, in-process: no sockets) and the response
size (bytes) of each. Usage: ``.venv/bin/python bench/monitor_cost.py [--runs 10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx
from starlette.applications import Starlette

from luftpause.config import DEFAULT_MODEL, parse_config
from luftpause.runtime.pods.notifications import Notifications
from luftpause.runtime.pods.operations import PodOperations
from luftpause.runtime.pods.scopes import RunScopes
from luftpause.runtime.pods.tree import TreeLimits
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.spec import RunSpec
from luftpause.runtime.web.monitor import monitor_routes

CONFIG = f'[[replicas]]\nname = "r"\nurl = "http://127.0.0.1:1"\nmodels = ["{DEFAULT_MODEL}"]\n'


def pods_without_journal(max_finished: int) -> PodOperations:
    """The runtime's pod operations over a registry without a journal (nothing is written), their
    parts built as ``luftpause.runtime.wiring.build_runtime`` builds them."""
    config = parse_config(CONFIG)
    changes = NetworkChanges()
    scopes = RunScopes(config, None, changes)
    notifications = Notifications(None, changes)
    tree = TreeLimits(config.runtime.max_depth, config.runtime.max_children, None, changes)
    registry = RunRegistry(
        max_finished=max_finished, changes=changes, listeners=(scopes, notifications, tree)
    )
    return PodOperations(registry, scopes, notifications, tree)


def build(runs: int) -> tuple[PodOperations, Run]:
    """A registry holding ``runs`` finished runs and one with a 400-message conversation."""
    pods = pods_without_journal(runs + 10)
    for i in range(runs):
        parent = f"run-{i - i % 10:06d}" if i % 10 else None
        spec = RunSpec(
            task=f"task {i}: summarise the document and report",
            model=DEFAULT_MODEL,
            service_class="batch",
            caller="bench",
            parent=parent,
        )
        run = pods.registry.add(
            Run(handle=f"run-{i:06d}", spec=spec, messages=[{"role": "user", "content": f"task {i}"}])
        )
        pods.registry.complete_round(run, [{"role": "assistant", "content": f"looking at part {i}"}])
        pods.registry.finish(run, "completed", answer=f"answer {i}: the document says this and that")
    long = pods.registry.get("run-000000")
    long.messages.extend({"role": "assistant", "content": "x" * 500} for _ in range(400))
    return pods, long


async def timed(what: Callable[[], Awaitable[httpx.Response]], repeat: int) -> tuple[float, int]:
    """Median milliseconds of ``repeat`` calls and the last response's size in bytes."""
    times = []
    size = 0
    for _ in range(repeat):
        start = time.perf_counter()
        response = await what()
        times.append((time.perf_counter() - start) * 1000)
        size = len(response.content)
    return statistics.median(times), size


async def measure(runs: int, repeat: int) -> None:
    pods, long = build(runs)
    app = Starlette(routes=monitor_routes(pods))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as client:

        async def after_change() -> httpx.Response:
            pods.registry.changes.bump()  # as any change does: the next poll builds the network
            return await client.get("/monitor/runs")

        version = (await client.get("/monitor/runs")).json()["version"]
        rows = [
            ("runs, after a change (build + encode)", await timed(after_change, repeat)),
            (
                "runs, same version, another page (cached)",
                await timed(lambda: client.get("/monitor/runs"), repeat),
            ),
        ]
        version = (await client.get("/monitor/runs")).json()["version"]
        rows.append(
            (
                "runs?version=current (unchanged)",
                await timed(lambda: client.get("/monitor/runs", params={"version": version}), repeat),
            )
        )
        path = f"/monitor/runs/{long.handle}"
        cursor = (await client.get(path)).json()["cursor"]
        rows.append(
            (
                f"conversation, whole ({len(long.messages)} messages)",
                await timed(lambda: client.get(path), repeat),
            )
        )
        rows.append(
            (
                "conversation?since=cursor (nothing new)",
                await timed(lambda: client.get(path, params={"since": str(cursor)}), repeat),
            )
        )
    print(f"monitor poll cost, {runs} retained runs, median of {repeat}:")
    for name, (ms, size) in rows:
        print(f"  {name:48s} {ms:9.2f} ms {size:>10,d} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(measure(args.runs, args.repeat))


if __name__ == "__main__":
    main()
