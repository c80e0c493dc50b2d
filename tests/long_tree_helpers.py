"""A long run tree of 200 runs on a real runtime, for the pages' tests (the monitor and the
scheduler's page with ``?runtime=``): the runs are spawned through the real ``mcp`` client and
grown by the scripted engine of :mod:`pods_helpers`, so the pages read them from the runtime's own
``/monitor/runs`` and ``/status``.

The tree, spawned in this order (oldest first, as the runtime lists it):

* ``live-old``: a root whose turn the engine holds (running), spawned before everything else;
* ``p00`` .. ``p37``: roots that spawn four children each (``pNN-c0`` .. ``pNN-c3``) and answer;
  every child answers, but ``c3`` of every fourth parent fails (its engine answers 503);
* ``done-0`` .. ``done-2``: roots that answer at once;
* ``live-tree`` with ``live-tree-c0`` and ``live-tree-c1`` under it, all three running, and the
  newest, ``live-new-0`` .. ``live-new-2``, running.

So 200 runs: 7 running (:data:`LIVE`, newest first), 183 completed, 10 failed. With runs listed
oldest first and every finished one taking a card, the live ones but ``live-old`` sit about 190
cards down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pods_helpers import Pod, call, get_json, script, start_pod, until

from luftpause.testkit.commands.loadgen import runtime_client
from luftpause.testkit.launch.procs import ChildProcess, free_port

PARENTS = 38
CHILDREN = 4
LIVE = ["live-new-2", "live-new-1", "live-new-0", "live-tree", "live-tree-c1", "live-tree-c0", "live-old"]
"""The running runs by name as the pages list them: newest first, a child under its parent."""
FAILED = [f"p{p:02d}-c3" for p in range(0, PARENTS, 4)]
TOTAL = 200
HOLD = {"hold": "never", "say": "never said"}  # running until the engine stops


def expected_roots() -> list[str]:
    """The roots in the order the pages list them: live first (running), then the trees holding a
    failed run, then the rest; newest first within each."""
    by_age = [
        "live-old",
        *(f"p{p:02d}" for p in range(PARENTS)),
        *(f"done-{i}" for i in range(3)),
        "live-tree",
    ]
    by_age += [f"live-new-{i}" for i in range(3)]
    running = [r for r in by_age if r.startswith("live")]
    failing = [f"p{p:02d}" for p in range(0, PARENTS, 4)]
    rest = [r for r in by_age if r not in running and r not in failing]
    return [*reversed(running), *reversed(failing), *reversed(rest)]


@dataclass
class LongTree:
    """The runtime holding the tree (``pod``, no token) and the handle of each run by name."""

    pod: Pod
    handles: dict[str, str]
    scheduler_url: str | None = None
    """The scheduler's HTTP base URL (its page at ``/``), when one was started beside it."""

    def name_of(self, handle: str) -> str:
        return next(name for name, h in self.handles.items() if h == handle)


def _parent_task(p: int) -> str:
    children = [
        script({"refuse": 503, "error": "engine: overloaded"})
        if c == 3 and p % 4 == 0
        else script({"say": f"child {c} of p{p:02d} answered"})
        for c in range(CHILDREN)
    ]
    spawns = [
        {"call": "spawn", "args": {"task": task, "name": f"p{p:02d}-c{c}"}} for c, task in enumerate(children)
    ]
    return script({"calls": spawns}, {"say": f"p{p:02d}: four children spawned"})


async def grow(pod: Pod) -> dict[str, str]:
    """Spawn the tree (module docstring) on ``pod`` and wait until every run is in its state;
    the handles by name."""
    handles: dict[str, str] = {}
    async with runtime_client(f"{pod.url}/mcp") as client:

        async def spawn(name: str, task: str, orchestrate: bool = False) -> str:
            handles[name] = (await call(client, "spawn", task=task, name=name, orchestrate=orchestrate))[
                "handle"
            ]
            return handles[name]

        await spawn("live-old", script(HOLD))
        for p in range(PARENTS):
            await spawn(f"p{p:02d}", _parent_task(p), orchestrate=True)
        for i in range(3):
            await spawn(f"done-{i}", script({"say": f"done {i}"}))

        def settled() -> bool:
            runs = get_json(f"{pod.url}/monitor/runs")["runs"]
            ended = [r for r in runs if r["runState"] in ("completed", "failed")]
            return len(ended) == PARENTS * (CHILDREN + 1) + 3

        async def finished() -> bool:
            return await asyncio.to_thread(settled)

        await until(finished, "the 193 finished runs", seconds=120)
        live_children = [script(HOLD), script(HOLD)]
        spawns = [
            {"call": "spawn", "args": {"task": task, "name": f"live-tree-c{c}"}}
            for c, task in enumerate(live_children)
        ]
        await spawn("live-tree", script({"calls": spawns}, HOLD), orchestrate=True)

        async def tree_spawned() -> bool:
            runs = (await call(client, "list", handle=handles["live-tree"]))["runs"]
            return len(runs) == 2

        await until(tree_spawned, "live-tree's two children")
        for i in range(3):
            await spawn(f"live-new-{i}", script(HOLD))

        def all_there() -> list[dict[str, Any]] | None:
            runs: list[dict[str, Any]] = get_json(f"{pod.url}/monitor/runs")["runs"]
            running = [r for r in runs if r["runState"] == "running"]
            return runs if len(runs) == TOTAL and len(running) == len(LIVE) else None

        async def ready() -> list[dict[str, Any]] | None:
            return await asyncio.to_thread(all_there)

        runs = await until(ready, "200 runs, 7 of them running", seconds=60)
    for run in runs:
        handles.setdefault(run["name"], run["handle"])
    return handles


@contextmanager
def long_tree(workdir: Path, *, with_scheduler: bool = False) -> Iterator[LongTree]:
    """A runtime over the scripted engine holding the 200-run tree; ``with_scheduler``: a scheduler
    process beside it (its page reads the runtime's ``/status``, which the runtime lets the
    scheduler's origin read). Everything is stopped when the block ends."""
    status_port = free_port()
    section = f'\n[scheduler]\ngrpc = "127.0.0.1:{free_port()}"\nhttp = "127.0.0.1:{status_port}"\n'
    with start_pod(workdir, workspace=None, max_children=8, extra_toml=section) as pod:
        scheduler: ChildProcess | None = None
        try:
            if with_scheduler:
                scheduler = ChildProcess(
                    "scheduler",
                    ["scheduler", "--config", str(pod.config)],
                    log_path=workdir / "scheduler.log",
                    ready_url=f"http://127.0.0.1:{status_port}/health",
                )
                scheduler.start()
                scheduler.wait_ready()
            handles = asyncio.run(grow(pod))
            yield LongTree(pod, handles, f"http://127.0.0.1:{status_port}" if with_scheduler else None)
        finally:
            if scheduler is not None:
                scheduler.stop()
