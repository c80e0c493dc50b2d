"""Interactive runs under a batch flood: SGLang's router vs luftpause, on simulated engines.

    .venv/bin/python bench/flood.py                      # flood + light-load control, 2 repetitions
    .venv/bin/python bench/flood.py --duration-s 20 --repeat 1 --json /tmp/flood.json
    .venv/bin/python bench/flood.py --shape bench/shapes/heavy-tail.toml --duration-s 60   # a load shape file

Two simulated engine replicas (``luftpause fake-engine``: continuous batching, a FIFO waiting
queue, a per-replica LRU prefix cache, decode slowing with the batch) are saturated by closed-loop
own-loop agents (:mod:`luftpause.testkit.load.agents`): 48 batch runs of caller ``bulk`` with 4
interactive runs of caller ``ide`` beside them, each run a few tool rounds on a system prompt of
its own. The same load is sent, one arrangement after another, with fresh engines each time:

* ``router``: straight to SGLang's router (``sglang-router``, ``--policy cache_aware``) in front of
  the two engines; skipped with the reason when the package is not installed;
* ``luftpause``: through the dataplane and scheduler;
* ``luftpause-no-affinity``: the same with the scheduler's strict affinity off
  (``[scheduler] strict_affinity = false``), to show how much of the gain is keeping a run on the replica
  that holds its prefix;
* ``luftpause-idle-off`` (only when asked for): the same with idle affinity off
  (``[scheduler] idle_affinity = "off"``), to show what keeping an idle run on its last replica gains.
* ``thunderagent`` (only when asked for): ThunderAgent's capacity scheduler (``--router tr``) in
  front of the engines as SGLang backends, each turn naming its run as ``program_id`` and each
  run's end releasing it; ThunderAgent runs from an install of its own (``thunderagent`` on
  ``PATH``, or ``LUFTPAUSE_BENCH_THUNDERAGENT``; see ``bench/pools.py`` for its resume-loop fix).

Then a light-load control (4 interactive runs only: the engines never queue), where every
arrangement should perform alike. Reported per arrangement: interactive runs/min, interactive run
time p50, batch runs/min and the prompt-token cache hit rate (``cached_tokens`` over
``prompt_tokens`` from the engines' usage), each the median over ``--repeat`` repetitions, with
ratios against the router when it was measured. Arrangements run in a rotated order in each
repetition, so drift on this shared machine does not favour one. Every figure is from SIMULATED
engines.

Settings that let the measured effects show: each engine's prefix cache is the simulator's default
(its KV pool, ``--slots`` x 8192 tokens), large enough to hold most runs' prefixes, so a run moved
to the other replica pays its whole prefill again (``--cache-tokens`` overrides it); luftpause's
replicas keep the configuration's default ``max_inflight`` (32), above the engines' slots, so the
scheduler admits by the engines' reported load rather than by a count equal to the slots
(``--max-inflight`` overrides it).

``--engine llama-server`` runs the same comparison on real inference: ``--replicas`` llama.cpp
``llama-server`` replicas on CPU (SmolLM2-135M, ``--slots`` slots and ``--threads`` threads each;
built once by ``bench/engines/llama_server.sh build`` and ``model``), the agents' tool rounds made
by the agents themselves (``--tool-rounds-by agent``: this model calls no tool unless forced, see
``--forced-calls``), and the
engines reached directly (``direct``, agents spread over them) measured too; every figure is then
REAL ENGINE, and the JSON carries ``"simulated": false`` and the llama.cpp build.

``--shape FILE.toml`` runs a whole load shape instead of the flags above: the same files
``bench/flood_sim.py --shape`` runs in virtual time (``bench/shapes/``; parsed by
:mod:`luftpause.testkit.sim.shapes`), their agent groups, replicas, slots, engine profile, queue
order, pool and seeds (one repetition per seed) on live processes; how each key maps is in
``bench/flood_load.py``. ``--duration-s`` and ``--repeat`` given still win; the load's other flags
are refused beside it.

``--forced-calls`` (llama-server only) makes the model call the tool: the replicas render tools
with a Qwen2.5-style ChatML tools template and every turn that offers the tool opens the call and
stops at its end (:mod:`luftpause.testkit.load.agents`), so the replies carry real tool calls, the agents
wait their tool time, and luftpause sees each run pause on its tool (``tool_paused``) as with a
model that calls tools by itself; ``--tool-rounds-by`` is then ``model``. ``--tool-choice`` sends
a ``tool_choice`` on each turn that offers the tool. ``--router-balance ABS,REL`` sets SGLang's
router's balance thresholds for the pool (its defaults, 64 and 1.5, never trigger on a few slots,
so a long prefix shared by every run sends every turn to one replica).

``--via mcp`` makes luftpause's runs sub-agents over MCP, as ``flood_sim.py --via mcp`` does in
virtual time: its arrangements also start the fake MCP server and the runtime, and two MCP clients
(callers ``claude-code``, interactive, and ``batch-orchestrator``, batch) keep as many sub-agents
running as there are agents (:mod:`luftpause.testkit.load.subagents`: spawned with the same system
prompt size, task and reply length, the fake MCP server's ``lookup`` as their one tool, the
runtime making their turns and tool rounds). The router, the gateway and ``direct`` get own-loop
agents of the same shape under the same caller names, their tool taking what ``lookup`` takes on
average (:data:`MCP_TOOL_SECONDS`), as ``fanout.py`` compares them.

Each pass also reads the engines' counters at its end (``sglang:cached_tokens`` over
``sglang:prompt_tokens``, ``sglang:num_retracted_requests``, or vLLM's ``vllm:prefix_cache_hits``
over ``vllm:prefix_cache_queries`` and ``vllm:num_preemptions``: the step model of ``--profile``;
a figure no engine showed is ``null``), the
only cache hit rate there is for sub-agents (their runtime keeps no cached-token counts), and the
1-minute load average before and after it.

``--json PATH`` writes ``{"simulated": true, "settings": {...}, "flood": [rows], "control":
[rows]}``, each row ``{"arrangement", "interactiveRunsPerMinute", "interactiveRunTimeP50",
"batchRunsPerMinute", "cacheHitRate", "engineCacheHitRate", "retractions", "failed", "toolRounds",
"unforced", "repetitions": [{... "loadAverage": [before, after], "replicas", "groups": [{"class",
"caller", "agents", "completed", "failed", "turns", "toolRounds"}]}]}``; with several groups of
a class, its runs/min are their sum and its run time p50 that of all their runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flood_load import Load, real_engine_refusal, shape_engine_args, shape_load
from flood_passes import (
    MCP_TOOL_SECONDS,
    Setup,
    engine_counters,
    measure,
    row_of,
    run_series,
)
from pools import (
    ARRANGEMENTS,
    DEFAULT_ARRANGEMENTS,
    DIRECT,
    LlamaEngines,
    RouterBalance,
    unavailable,
)  # bench/ is on sys.path: this script's directory

from luftpause.testkit.launch import llama_server
from luftpause.testkit.load.agents import (
    TOOL_CHOICES,
    TOOL_ROUNDS_BY,
)
from luftpause.testkit.sim.shapes import ShapeError, ShapeFile, load_shape_file

__all__ = [
    "MCP_TOOL_SECONDS",
    "VIAS",
    "Setup",
    "engine_counters",
    "main",
    "measure",
    "render",
    "row_of",
    "run_series",
]

VIAS = ("own_loop", "mcp")


def render(
    title: str, rows: list[dict[str, Any]], skipped: dict[str, str], engines: str = "SIMULATED engines"
) -> str:
    base = next((r for r in rows if r["arrangement"] == "router"), None)

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row[key]
        if value is None:
            return "-"
        text = format(value, fmt)
        if base is not None and row is not base and base[key]:
            text += f" ({value / base[key]:.2f}x)"
        return text

    against = "ratios against the router" if base is not None else "the router not measured, no ratios"
    lines = [
        f"{title} ({engines}; {against})",
        f"{'arrangement':<24}{'interactive runs/min':>26}{'interactive p50 s':>24}"
        f"{'batch runs/min':>24}{'cache hits':>20}{'engines: cache':>20}{'retracted':>11}{'failed':>8}",
    ]
    for row in rows:
        retracted = "-" if row["retractions"] is None else format(row["retractions"], "g")
        lines.append(
            f"{row['arrangement']:<24}{cell(row, 'interactiveRunsPerMinute', '.1f'):>26}"
            f"{cell(row, 'interactiveRunTimeP50', '.2f'):>24}{cell(row, 'batchRunsPerMinute', '.1f'):>24}"
            f"{cell(row, 'cacheHitRate', '.1%'):>20}{cell(row, 'engineCacheHitRate', '.1%'):>20}"
            f"{retracted:>11}{row['failed']:>8}"
        )
    loads = [la for row in rows for p in row["repetitions"] for la in p.get("loadAverage") or ()]
    if loads:
        lines.append(f"(load average over the passes, 1 min: {min(loads):.1f} to {max(loads):.1f})")
    lines += [f"{name:<24}not measured: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape",
        metavar="FILE.toml",
        help="a load shape file (bench/shapes/, as flood_sim.py --shape): its agents, replicas, slots, "
        "engine profile and seeds; --duration-s and --repeat given still win, the load's other flags "
        "are refused with it",
    )
    parser.add_argument(
        "--duration-s", type=float, default=None, help="seconds per pass (default 60, or the shape file's)"
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="repetitions (default 2, or one per seed of the shape file)"
    )
    parser.add_argument("--batch", type=int, default=None, help="batch agents in the flood (default 48)")
    parser.add_argument("--interactive", type=int, default=None, help="interactive agents (default 4)")
    parser.add_argument("--slots", type=int, default=None, help="running slots per engine (default 8)")
    parser.add_argument(
        "--context-tokens", type=int, default=None, help="system prompt per run (default 2000)"
    )
    parser.add_argument("--tool-rounds", type=int, default=None, help="tool rounds per run (default 3)")
    parser.add_argument(
        "--tool-seconds", type=float, default=None, help="seconds per tool call (default 0.5)"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="reply tokens per turn (default 48)")
    parser.add_argument(
        "--cache-tokens",
        type=int,
        default=None,
        help="prefix cache per engine in tokens (default: the simulator's, its KV pool, slots x 8192)",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="luftpause's max_inflight per replica (default: the configuration's, so admission "
        "follows the engines' load)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="the simulator's time scale (default 1)"
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="run the engines' step model of this profile (fake-engine --profile), --slots as its "
        "--max-running; default: the slot model",
    )
    parser.add_argument(
        "--arrangements",
        default=None,
        help=f"comma-separated, of {', '.join((*ARRANGEMENTS, DIRECT))} "
        f"(default: {', '.join(DEFAULT_ARRANGEMENTS)}, and {DIRECT} on llama-server)",
    )
    parser.add_argument(
        "--engine",
        choices=("sim", "llama-server"),
        default="sim",
        help="sim: the simulator (default); llama-server: real llama.cpp replicas on CPU",
    )
    parser.add_argument(
        "--replicas", type=int, default=None, help="engine replicas (default 2, or the shape file's)"
    )
    parser.add_argument("--threads", type=int, default=1, help="threads per llama-server (default 1)")
    parser.add_argument(
        "--tool-rounds-by",
        choices=TOOL_ROUNDS_BY,
        default=None,
        help="who makes a tool round (default: the agent on llama-server without --forced-calls, "
        "else the model)",
    )
    parser.add_argument(
        "--tool-choice",
        choices=TOOL_CHOICES,
        default=None,
        help="the agents' tool_choice on every turn that offers the tool (default: none sent)",
    )
    parser.add_argument(
        "--forced-calls",
        action="store_true",
        help="llama-server only: the replicas render tools with a Qwen2.5-style ChatML tools template "
        "and every turn that offers the tool opens the call and stops at its end, so the model "
        "calls the tool and luftpause sees the run pause on it (luftpause.testkit.load.agents)",
    )
    parser.add_argument(
        "--router-balance",
        metavar="ABS,REL",
        default=None,
        help="SGLang's router's --balance-abs-threshold and --balance-rel-threshold, for a pool "
        "smaller than its defaults (64, 1.5) assume",
    )
    parser.add_argument(
        "--via",
        choices=VIAS,
        default=None,
        help="own_loop: own-loop agents through each arrangement (default); mcp: luftpause's runs are "
        "sub-agents spawned over MCP on its runtime (with the fake MCP server's lookup as their tool), "
        "the other arrangements get own-loop agents of the same shape, their tool taking "
        f"{MCP_TOOL_SECONDS:g} s (lookup's average); --tool-seconds is then ignored",
    )
    parser.add_argument("--no-control", action="store_true", help="skip the light-load control")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    real = args.engine == "llama-server"
    shape: ShapeFile | None = None
    if args.shape is not None:
        given = [
            flag
            for flag, value in (
                ("--batch", args.batch), ("--interactive", args.interactive), ("--slots", args.slots),
                ("--context-tokens", args.context_tokens), ("--tool-rounds", args.tool_rounds),
                ("--tool-seconds", args.tool_seconds), ("--max-tokens", args.max_tokens),
                ("--profile", args.profile), ("--replicas", args.replicas), ("--via", args.via),
                ("--cache-tokens", args.cache_tokens),
            )
            if value is not None
        ]  # fmt: skip
        if given:
            parser.error(f"{', '.join(given)}: the shape file says the load; leave these out with --shape")
        try:
            shape = load_shape_file(Path(args.shape))
        except ShapeError as error:
            parser.error(str(error))
        if real and (why := real_engine_refusal(shape)):
            parser.error(why)
    via = args.via or (shape.load.groups[0].via if shape else "own_loop")
    if real and via == "mcp":
        parser.error("--via mcp runs on the simulator only")
    if args.forced_calls and not real:
        parser.error(
            "--forced-calls is for --engine llama-server (the simulated model calls tools by itself)"
        )
    router_balance: RouterBalance | None = None
    if args.router_balance is not None:
        try:
            absolute, relative = args.router_balance.split(",")
            router_balance = RouterBalance(int(absolute), float(relative))
        except ValueError:
            parser.error(
                f"--router-balance wants ABS,REL (an integer and a number), got {args.router_balance!r}"
            )
    default = [*DEFAULT_ARRANGEMENTS, DIRECT] if real else list(DEFAULT_ARRANGEMENTS)
    wanted = [a for a in args.arrangements.split(",") if a] if args.arrangements else default
    if unknown := [a for a in wanted if a not in (*ARRANGEMENTS, DIRECT)]:
        parser.error(f"unknown arrangements {unknown}; choose from {(*ARRANGEMENTS, DIRECT)}")
    slots = shape.slots if shape and shape.slots is not None else (args.slots or 8)
    replicas = args.replicas or (shape.replicas if shape else 2)
    llama: LlamaEngines | None = None
    installed = llama_server.find()
    if real:
        if installed is None:
            parser.error(llama_server.missing())
        template = llama_server.tools_template() if args.forced_calls else None
        if args.forced_calls and template is None:
            parser.error(llama_server.missing_template())
        options = llama_server.ReplicaOptions(parallel=slots, threads=args.threads, chat_template=template)
        llama = LlamaEngines(replicas, options)
    skipped = {a: why for a in wanted if (why := unavailable(a))}
    arrangements = [a for a in wanted if a not in skipped]
    tool_rounds_by = args.tool_rounds_by or ("agent" if real and not args.forced_calls else "model")
    duration_s = args.duration_s or (shape.load.duration_s if shape else 60.0)
    seeds = list(shape.seeds) if shape else [0]
    repeat = args.repeat or (len(seeds) if shape else 2)
    if shape is not None:
        flood = shape_load(shape, duration_s, tool_rounds_by)
    else:
        flood = Load(
            args.batch if args.batch is not None else 48,
            args.interactive if args.interactive is not None else 4,
            duration_s=duration_s,
            tool_rounds=args.tool_rounds if args.tool_rounds is not None else 3,
            context_tokens=args.context_tokens or 2000,
            tool_seconds=MCP_TOOL_SECONDS if via == "mcp" else (args.tool_seconds or 0.5),
            max_tokens=args.max_tokens or 48,
            tool_rounds_by=tool_rounds_by,
            via=via,
        )
    # agent-made tool rounds stand for a model that never calls tools: the simulated one makes none
    model_rounds = 0 if tool_rounds_by == "agent" else flood.tool_rounds
    engine_args = [
        "--slots", str(slots), "--prefill-ms-per-1k", "40", "--decode-ms", "8",
        "--batch-slowdown", "0.05",
        "--tool-rounds", str(model_rounds), "--time-scale", str(args.time_scale),
    ]  # fmt: skip
    if shape is not None:
        engine_args = shape_engine_args(shape, model_rounds, args.time_scale)
    elif args.profile:
        engine_args = [
            "--profile", args.profile, "--max-running", str(slots),
            "--tool-rounds", str(model_rounds), "--time-scale", str(args.time_scale),
        ]  # fmt: skip
    if args.cache_tokens is not None:
        engine_args += ["--cache-tokens", str(args.cache_tokens)]
    engines = "SIMULATED engines"
    engine_settings: list[str] | dict[str, Any] = engine_args
    if llama is not None and installed is not None:
        engines = f"REAL ENGINE: {llama.replicas} x llama-server, {slots} slots, CPU, SmolLM2-135M"
        engine_settings = {
            "llamaServer": installed.revision(),
            "replicas": llama.replicas,
            "argv": llama_server.replica_argv(installed, 0, llama.options)[1:],
        }
    setup = Setup(
        engine_args,
        args.max_inflight,
        llama,
        replicas,
        router_balance,
        args.tool_choice,
        args.forced_calls,
    )
    flood_settings = {k: v for k, v in vars(flood).items() if k != "shape_groups"}
    result: dict[str, Any] = {
        "simulated": not real,
        "settings": {
            "argv": sys.argv[1:] if argv is None else argv,
            "engine": engine_settings,
            "shapeFile": args.shape,
            "flood": {**flood_settings, "groups": [repr(g) for g in flood.shape_groups]},
            "repeat": repeat,
            "seeds": seeds,
            "maxInflight": args.max_inflight,
            "routerBalance": args.router_balance,
            "toolChoice": args.tool_choice,
            "forcedCalls": args.forced_calls,
            "skipped": skipped,
        },
    }
    result["flood"] = run_series("flood", flood, arrangements, repeat, setup, seeds)
    print(render("Interactive under a batch flood", result["flood"], skipped, engines))
    if not args.no_control:
        result["control"] = run_series("control", flood.light(), arrangements, repeat, setup, seeds)
        print(render("Light-load control (no queue)", result["control"], skipped, engines))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
