"""The runtime's store: spawn + await of short sub-agents, file journal vs PostgreSQL with 1, 2 and
3 runtimes sharing it, and the time from a runtime's death to its runs resumed by another.

    .venv/bin/python bench/runtime_store.py                 # 90 runs per arrangement
    .venv/bin/python bench/runtime_store.py --runs 60 --json /tmp/store.json
    .venv/bin/python bench/runtime_store.py --runs 60 --runtimes 1 --no-takeover  # short
    .venv/bin/python bench/runtime_store.py --lookups 500   # the store's operations, pooled or not

One simulated engine (``luftpause fake-engine``, 64 slots, 1 ms per output token, no tool rounds)
is every runtime's dataplane, so a run is one short turn and what is measured is the runtime's own
work per run: the MCP ``spawn``, the run's records made durable (an fsync, or a commit), its turn,
its end, the ``await``. PostgreSQL is a cluster of its own started in a temporary folder (Debian's
``postgresql``, as the tests start it: tests/postgres_helpers.py), on the same machine.

* ``file``: one runtime, ``[runtime] store = "file"`` (``runs.jsonl``, the default);
* ``postgresql xN``: N runtime processes on one database; the runs are spawned round-robin over
  them (the official ``mcp`` client), each awaited on the runtime that spawned it.

Reported: runs per second (runs / wall time from the first spawn to the last answer), the ratio
against ``file`` measured in the same run; then the takeover: two runtimes on PostgreSQL, 20 long
runs on the first, the first SIGKILLed; the seconds until the second holds and drives every one of
them (its ``status`` answers for each), against the lease (10 s, renewed every 2 s). SIMULATED
engine; ``--json PATH`` writes the rows.

``--lookups N`` measures instead one of the store's own operations, in this process: N lookups of
which runtime holds a run (what a call about a run held elsewhere asks first), each on a pooled
connection (the store open) and each on a connection of its own (the store closed), alternately
in rounds of 50; operations per second of each and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # postgres_helpers: the tests' own PostgreSQL

from mcp import Client  # noqa: E402
from postgres_helpers import postgres_server  # noqa: E402

from luftpause.config import DEFAULT_MODEL  # noqa: E402
from luftpause.runtime.runs.custody import LEASE_SECONDS, RENEW_SECONDS  # noqa: E402
from luftpause.testkit.launch.procs import ChildProcess, free_port  # noqa: E402


def start_engine(workdir: Path, decode_ms: float) -> tuple[ChildProcess, str]:
    port = free_port()
    engine = ChildProcess(
        f"engine-{port}",
        [
            "fake-engine",
            "--port",
            str(port),
            "--slots",
            "64",
            "--decode-ms",
            str(decode_ms),
            "--tool-rounds",
            "0",
        ],
        workdir / f"engine-{port}.log",
        ready_port=("127.0.0.1", port),
    )
    engine.start().wait_ready()
    return engine, f"http://127.0.0.1:{port}"


def start_runtime(workdir: Path, engine_url: str, store: str) -> tuple[ChildProcess, str]:
    port = free_port()
    folder = workdir / f"runtime-{port}"
    folder.mkdir()
    config = folder / "luftpause.toml"
    config.write_text(
        f"""
[runtime]
listen = "127.0.0.1:{port}"
dataplane = "{engine_url}"
state_dir = "{folder / "state"}"

[[replicas]]
name = "sim"
url = "{engine_url}"
models = ["{DEFAULT_MODEL}"]
"""
    )
    env = {"LUFTPAUSE_TOKEN": ""}
    if store != "file":
        env["LUFTPAUSE_RUNTIME__STORE"] = store
    runtime = ChildProcess(
        f"runtime-{port}",
        ["runtime", "--config", str(config)],
        folder / "runtime.log",
        env=env,
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    runtime.start().wait_ready()
    return runtime, f"http://127.0.0.1:{port}/mcp"


def _structured(result: Any) -> dict[str, Any]:
    if result.is_error or not isinstance(result.structured_content, dict):
        raise RuntimeError(f"tool failed: {result.content}")
    return result.structured_content


async def spawn_and_await(urls: list[str], runs: int, max_tokens: int) -> float:
    """Spawn ``runs`` sub-agents round-robin over ``urls`` and await each where it was spawned;
    the wall seconds."""
    async with contextlib.AsyncExitStack() as stack:  # left in reverse, as anyio's scopes need
        clients = [await stack.enter_async_context(Client(url)) for url in urls]
        gate = asyncio.Semaphore(16)

        async def spawn(i: int) -> tuple[int, str]:
            async with gate:
                result = await clients[i % len(clients)].call_tool(
                    "spawn", {"task": f"Say hello to number {i}.", "maxTokens": max_tokens}
                )
            return i % len(clients), str(_structured(result)["handle"])

        started = time.monotonic()
        spawned = await asyncio.gather(*(spawn(i) for i in range(runs)))
        by_runtime: dict[int, list[str]] = {}
        for index, handle in spawned:
            by_runtime.setdefault(index, []).append(handle)

        async def await_all(index: int, handles: list[str]) -> None:
            result = _structured(
                await clients[index].call_tool(
                    "await", {"handles": handles, "timeout": 300}, read_timeout_seconds=360
                )
            )
            states = [run["state"] for run in result["runs"]]
            if result["timedOut"] or states != ["completed"] * len(handles):
                raise RuntimeError(f"not all completed: {states}")

        await asyncio.gather(*(await_all(i, h) for i, h in by_runtime.items()))
        return time.monotonic() - started


def throughput(workdir: Path, store: str, runtimes: int, runs: int) -> float:
    engine, engine_url = start_engine(workdir, decode_ms=1.0)
    started: list[ChildProcess] = []
    try:
        urls = []
        for _ in range(runtimes):
            runtime, url = start_runtime(workdir, engine_url, store)
            started.append(runtime)
            urls.append(url)
        asyncio.run(spawn_and_await(urls, 6, 8))  # warm: connections, first imports
        return asyncio.run(spawn_and_await(urls, runs, 8))
    finally:
        for runtime in started:
            runtime.stop()
        engine.stop()


async def _known(url: str, handles: list[str]) -> bool:
    async with Client(url) as client:
        for handle in handles:
            result = await client.call_tool("status", {"handle": handle})
            if result.is_error:
                return False
    return True


def takeover(workdir: Path, store: str, runs: int = 20) -> float:
    engine, engine_url = start_engine(workdir, decode_ms=200.0)  # runs that last a minute
    first, first_url = start_runtime(workdir, engine_url, store)
    second, second_url = start_runtime(workdir, engine_url, store)
    try:

        async def spawn() -> list[str]:
            async with Client(first_url) as client:
                return [
                    str(
                        _structured(await client.call_tool("spawn", {"task": f"long {i}", "maxTokens": 300}))[
                            "handle"
                        ]
                    )
                    for i in range(runs)
                ]

        handles = asyncio.run(spawn())
        time.sleep(RENEW_SECONDS + 0.5)  # a renewal after the last spawn: the usual case
        killed = time.monotonic()
        first.kill()
        while not asyncio.run(_known(second_url, handles)):
            if time.monotonic() - killed > 120:
                raise RuntimeError("the second runtime never took the runs over")
            time.sleep(0.2)
        return time.monotonic() - killed
    finally:
        second.stop()
        first.stop()
        engine.stop()


def lookups(url: str, count: int) -> dict[str, float]:
    """Operations per second of ``count`` lookups of a run's lease, pooled and on connections of
    their own (module docstring)."""
    from luftpause.runtime.runs.custody import Custody
    from luftpause.runtime.runs.postgres import PostgresDatabase

    database = PostgresDatabase(url, owner="bench/127.0.0.1:1")
    runs = database.journal("runs")
    runs.claim()
    spent = {"pooled": 0.0, "own connection": 0.0}

    def look(conn: Any) -> Any:
        return Custody.whereabouts(conn, "run-bench")

    for _ in range(max(1, count // 50)):
        for kind in spent:
            if kind == "pooled":
                database.open_pool()
            try:
                database.run(look)  # a first use (the pool's first connection) not timed
                started = time.perf_counter()
                for _ in range(50):
                    database.run(look)
                spent[kind] += time.perf_counter() - started
            finally:
                if kind == "pooled":
                    database.close_pool()
    done = 50 * max(1, count // 50)
    return {kind: done / seconds for kind, seconds in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=90, help="runs per arrangement (default: 90)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--runtimes",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="how many runtimes share the database, one arrangement each (default: 1 2 3)",
    )
    parser.add_argument("--no-takeover", action="store_true", help="leave the takeover out")
    parser.add_argument("--lookups", type=int, help="measure N lookups of a run's lease instead")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    if args.lookups:
        with postgres_server() as postgres:
            rates = lookups(postgres.database(), args.lookups)
        for kind, rate in rates.items():
            print(f"lookups, {kind:15} {rate:8.0f} /s  x{rate / rates['own connection']:.1f}")
            rows.append({"arrangement": f"lookups, {kind}", "operationsPerSecond": rate})
        if args.json is not None:
            args.json.write_text(json.dumps({"simulated": True, "rows": rows}, indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp, postgres_server() as postgres:
        workdir = Path(tmp)
        arrangements = [("file", "file", 1)] + [
            (f"postgresql x{n}", postgres.database(), n) for n in args.runtimes
        ]
        base = None
        for name, store, runtimes in arrangements:
            wall = throughput(workdir, store, runtimes, args.runs)
            rate = args.runs / wall
            base = base or rate
            rows.append({"arrangement": name, "runtimes": runtimes, "runs": args.runs, "runsPerSecond": rate})
            print(
                f"{name:16} {runtimes} runtime(s)  {rate:7.1f} runs/s  x{rate / base:.2f} of file", flush=True
            )
        if not args.no_takeover:
            seconds = takeover(workdir, postgres.database())
            print(
                f"takeover: {seconds:.1f} s from the SIGKILL to every run held and driven by the other "
                f"runtime (lease {LEASE_SECONDS:.0f} s, renewed every {RENEW_SECONDS:.0f} s)"
            )
            rows.append({"arrangement": "takeover", "seconds": seconds, "leaseSeconds": LEASE_SECONDS})
    if args.json is not None:
        args.json.write_text(json.dumps({"simulated": True, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
