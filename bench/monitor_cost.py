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
from luftpause.runtime.pods.operations import Pods
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.web.monitor import monitor_routes

CONFIG = f'[[replicas]]\nname = "r"\nurl = "http://127.0.0.1:1"\nmodels = ["{DEFAULT_MODEL}"]\n'


def build(runs: int) -> tuple[Pods, Run]:
    """A registry holding ``runs`` finished runs and one with a 400-message conversation."""
    pods = Pods(RunRegistry(max_finished=runs + 10), parse_config(CONFIG))
    for i in range(runs):
        parent = f"run-{i - i % 10:06d}" if i % 10 else None
        run = Run(
            handle=f"run-{i:06d}",
            task=f"task {i}: summarise the document and report",
            model=DEFAULT_MODEL,
            service_class="batch",
            caller="bench",
            max_tool_calls=8,
            max_tokens=256,
            allowed_tools=None,
            messages=[{"role": "user", "content": f"task {i}"}],
            parent=parent,
        )
        pods.registry.add(run)
        run.complete_round([{"role": "assistant", "content": f"looking at part {i}"}])
        run.finish("completed", answer=f"answer {i}: the document says this and that")
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
    app = Starlette(routes=monitor_routes(lambda: pods))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as client:

        async def after_change() -> httpx.Response:
            pods.registry.version += 1  # as any change does: the next poll builds the network
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
