"""Fan-out: 16 sub-agents spawned over MCP and awaited, vs one at a time, vs straight to the router.

    .venv/bin/python bench/fanout.py                    # 16 runs, 2 repetitions
    .venv/bin/python bench/fanout.py --runs 8 --repeat 1 --json /tmp/fanout.json

Two simulated engine replicas (``luftpause fake-engine``, 4 running slots each, 8 ms per output
token, two tool rounds per run) serve the same work three ways, with fresh engines each time:

* ``spawn-all``: the whole luftpause stack; ``N`` sub-agents spawned at once through the runtime's
  MCP ``spawn`` (the official ``mcp`` client) and awaited together (``luftpause loadgen --spawn``);
* ``spawn-sequential``: the same, one sub-agent at a time (``--sequential``);
* ``router``: ``N`` own-loop agents (:mod:`luftpause.testkit.load.agents`) at once, straight to SGLang's
  router (``cache_aware``) in front of the engines; their tools are simulated in the agent (0.1 s
  a call, about what the fake MCP server's ``lookup`` and ``deep_search`` take on average).

Reported: wall time until all ``N`` runs ended, runs completed, and run time p50, each the median
over ``--repeat`` repetitions, with ratios against ``spawn-all``. Every figure is from SIMULATED
engines. ``--json PATH`` writes ``{"simulated": true, "runs", "rows": [{"arrangement",
"wallSeconds", "completed", "runTimeP50", "repetitions"}], "skipped": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pools import Pool, unavailable  # bench/ is not a package

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.commands.loadgen import drive, drive_sequential, percentile
from luftpause.testkit.launch.stack import Stack
from luftpause.testkit.load.agents import AgentGroup, AgentSettings, RunOutcome, run_once

ARRANGEMENTS = ("spawn-all", "spawn-sequential", "router")
SLOTS, DECODE_MS, TOOL_ROUNDS, MAX_TOKENS = 4, 8.0, 2, 256
TASK = "Research the question with the tools you have, then answer in three sentences."


def through_runtime(runs: int, sequential: bool) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="fanout-") as tmp,
        Stack.start(Path(tmp), slots=SLOTS, decode_ms=DECODE_MS, tool_rounds=TOOL_ROUNDS) as stack,
    ):
        stack.wait_connected()
        drive_spawn = drive_sequential if sequential else drive
        started = time.monotonic()
        summary = asyncio.run(drive_spawn(stack.runtime_url, runs, TASK, "interactive", 600.0))
        wall = time.monotonic() - started
    data = summary.as_dict()
    return {"wallSeconds": round(wall, 3), "completed": data["completed"], "runTimeP50": data["runTimeP50"]}


def through_router(runs: int) -> dict[str, Any]:
    engine_args = ["--slots", str(SLOTS), "--decode-ms", str(DECODE_MS), "--tool-rounds", str(TOOL_ROUNDS)]
    with (
        tempfile.TemporaryDirectory(prefix="fanout-router-") as tmp,
        Pool(Path(tmp), "router", engine_args) as pool,
    ):
        settings = AgentSettings(
            proxy=pool.url,
            model=DEFAULT_MODEL,
            task=TASK,
            tool_rounds=TOOL_ROUNDS,
            context_tokens=200,
            tool_seconds=0.1,
            max_tokens=MAX_TOKENS,
        )
        spec = AgentGroup(runs, "interactive", "fanout")
        outcomes = [RunOutcome(group=0, service_class="interactive", caller="fanout") for _ in range(runs)]

        async def all_runs() -> None:
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(*(run_once(session, settings, spec, o) for o in outcomes))

        started = time.monotonic()
        asyncio.run(all_runs())
        wall = time.monotonic() - started
    done = sorted(o.seconds for o in outcomes if o.state == "completed")
    return {"wallSeconds": round(wall, 3), "completed": len(done), "runTimeP50": percentile(done, 50)}


def measure(arrangement: str, runs: int) -> dict[str, Any]:
    if arrangement == "router":
        return through_router(runs)
    return through_runtime(runs, sequential=arrangement == "spawn-sequential")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16, help="sub-agents / agents per pass (default 16)")
    parser.add_argument("--repeat", type=int, default=2, help="repetitions (default 2)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    skipped = {a: why for a in ARRANGEMENTS if (why := unavailable(a))}
    arrangements = [a for a in ARRANGEMENTS if a not in skipped]
    passes: dict[str, list[dict[str, Any]]] = {a: [] for a in arrangements}
    for rep in range(args.repeat):
        order = arrangements[rep % len(arrangements) :] + arrangements[: rep % len(arrangements)]
        for arrangement in order:
            figures = measure(arrangement, args.runs)
            print(f"#{rep + 1} {arrangement}: {figures}", file=sys.stderr)
            passes[arrangement].append(figures)
    rows = []
    for arrangement in arrangements:
        row: dict[str, Any] = {"arrangement": arrangement}
        for key in ("wallSeconds", "completed", "runTimeP50"):
            values = [p[key] for p in passes[arrangement] if p[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["repetitions"] = passes[arrangement]
        rows.append(row)
    base = rows[0]["wallSeconds"] if rows and rows[0]["arrangement"] == "spawn-all" else None
    print(f"Fan-out of {args.runs} runs (SIMULATED engines; wall time ratio against spawn-all)")
    print(f"{'arrangement':<20}{'wall s':>16}{'completed':>12}{'run p50 s':>12}")
    for row in rows:
        wall = row["wallSeconds"]
        ratio = f" ({wall / base:.2f}x)" if base and wall is not None else ""
        p50 = "-" if row["runTimeP50"] is None else f"{row['runTimeP50']:.2f}"
        print(f"{row['arrangement']:<20}{f'{wall:.2f}{ratio}':>16}{row['completed']:>12}{p50:>12}")
    for name, why in skipped.items():
        print(f"{name:<20}not measured: {why}")
    if args.json:
        result = {"simulated": True, "runs": args.runs, "rows": rows, "skipped": skipped}
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
