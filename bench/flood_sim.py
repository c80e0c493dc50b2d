"""Floods in virtual time: every arrangement on the same engine models, seconds of wall time each.

    .venv/bin/python bench/flood_sim.py                                  # the published table's shape
    .venv/bin/python bench/flood_sim.py --slots 8 --via mcp --json /tmp/flood-sim.json
    .venv/bin/python bench/flood_sim.py --replay trace.jsonl             # a recorded trace, replayed
    .venv/bin/python bench/flood_sim.py --shape bench/shapes/heavy-tail.toml  # a load shape file

One discrete-event simulation per arrangement and seed (:mod:`luftpause.testkit.sim`): no process,
no socket, deterministic for a seed. The engines are engine models (:mod:`luftpause.testkit.engine.
model`, ``--profile``, default SGLang serving Llama-3.2-1B FP8 on an 8 GB GPU), two replicas, with
``--slots`` running requests each at most (``none``: the profile's own bound, for SGLang its KV
pool). The load is the published table's (:func:`luftpause.testkit.sim.workload.published_shape`:
48 batch + 4 interactive closed-loop agents, Llama-3-counted 8,000-character contexts, 3 tool
rounds of ``--tool-seconds``, 256 reply tokens, ``--duration-s``); ``--via mcp`` makes them
sub-agents over MCP. ``--shape FILE.toml`` runs a whole load shape instead (its agents, engines,
seeds and window; :mod:`luftpause.testkit.sim.shapes`; ``--seeds`` and ``--duration-s`` given
still win). ``--queue`` and ``--pool-scale`` set every arrangement's engines alike (SGLang's
``lpm`` or priority scheduling; a larger or smaller KV pool). Arrangements (``--arrangements``):
``router`` (SGLang's router 0.3.2, ``cache_aware``, the baseline), ``smg`` (SGLang Model Gateway:
sticky by run id, priority classes; ``--smg-capacity load`` sets its slot pool for the load),
``thunderagent`` (its ``tr`` scheduler), ``continuum`` (its engines behind the router),
``luftpause``, ``luftpause-moving`` (strict affinity off), ``direct``. Then a light-load control
(the interactive agents alone), where every arrangement should perform alike.

Each figure is the median over ``--seeds``; ratios are against the router. Every figure is
SIMULATED. ``--json PATH`` writes ``{"simulated": true, "settings", "flood": [rows], "control":
[rows]}``, a row ``{"arrangement", "interactiveRunsPerMinute", "interactiveRunTimeP50",
"batchRunsPerMinute", "cacheHitRate", "failed", "movedRuns", "seeds": [reports]}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from luftpause.scheduler.core.policies.idle_affinity import IDLE_MODES, IdleAffinity
from luftpause.scheduler.core.policies.pause_hold import HOLD_MODES, PauseHold
from luftpause.testkit.sim.flood import ARRANGEMENTS, QUEUES, FloodSpec, by_class, simulate
from luftpause.testkit.sim.gateway import GatewaySettings
from luftpause.testkit.sim.replay import Trace, load_trace, replay_shape
from luftpause.testkit.sim.shapes import ShapeError, ShapeFile, load_shape_file
from luftpause.testkit.sim.workload import LoadShape, llamacpp_shape, published_shape

PROFILE = "sglang-llama-3.2-1b-fp8-8gb"


def row_of(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of one simulated pass, as ``bench/flood.py`` reports a live one."""
    groups = report["groups"]
    prompt = sum(g["promptTokens"] for g in groups)
    cached = sum((g["cacheHitRate"] or 0.0) * g["promptTokens"] for g in groups)
    interactive = by_class(report, "interactive", "runsPerMinute")
    batch = by_class(report, "batch", "runsPerMinute")
    return {
        "interactiveRunsPerMinute": interactive,
        "interactiveRunTimeP50": by_class(report, "interactive", "runTimeP50"),
        "batchRunsPerMinute": batch,
        "totalRunsPerMinute": (interactive or 0.0) + (batch or 0.0),
        "cacheHitRate": round(cached / prompt, 4) if prompt else None,
        "failed": sum(g["failed"] for g in groups),
        "movedRuns": sum(g["movedRuns"] for g in groups),
    }


KEYS = (
    "interactiveRunsPerMinute",
    "interactiveRunTimeP50",
    "batchRunsPerMinute",
    "totalRunsPerMinute",
    "cacheHitRate",
)


def series(
    shape: LoadShape | Trace, arrangements: list[str], seeds: list[int], **spec: Any
) -> list[dict[str, Any]]:
    """Every arrangement over every seed: one row per arrangement, medians over the seeds."""
    rows = []
    for arrangement in arrangements:
        passes = []
        for seed in seeds:
            report = simulate(FloodSpec(shape, seed=seed, **spec), arrangement)
            passes.append({**row_of(report), "report": report})
        row: dict[str, Any] = {"arrangement": arrangement}
        for key in KEYS:
            values = [p[key] for p in passes if p[key] is not None]
            row[key] = round(statistics.median(values), 4) if values else None
        row["failed"] = sum(p["failed"] for p in passes)
        row["movedRuns"] = sum(p["movedRuns"] for p in passes)
        row["wallSeconds"] = round(sum(p["report"]["wallSeconds"] for p in passes), 2)
        row["seeds"] = passes
        rows.append(row)
    return rows


def render(title: str, rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["arrangement"] == "router"), None)

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row[key]
        if value is None:
            return "-"
        text = format(value, fmt)
        if base is not None and row is not base and base[key]:
            text += f" ({value / base[key]:.2f}x)"
        return text

    lines = [
        f"{title} (SIMULATED; ratios against the router)",
        f"{'arrangement':<20}{'interactive runs/min':>24}{'interactive p50 s':>22}"
        f"{'batch runs/min':>22}{'cache hits':>18}{'moved':>7}{'failed':>7}{'wall s':>8}",
    ]
    for row in rows:
        lines.append(
            f"{row['arrangement']:<20}{cell(row, 'interactiveRunsPerMinute', '.1f'):>24}"
            f"{cell(row, 'interactiveRunTimeP50', '.2f'):>22}{cell(row, 'batchRunsPerMinute', '.1f'):>22}"
            f"{cell(row, 'cacheHitRate', '.1%'):>18}{row['movedRuns']:>7}{row['failed']:>7}"
            f"{row['wallSeconds']:>8}"
        )
    return "\n".join(lines)


def _field_value(item: str, parser: argparse.ArgumentParser) -> tuple[str, int | float]:
    """``FIELD=VALUE`` of ``--profile-set``, the value an int or a float."""
    name, sep, text = item.partition("=")
    if not sep or not name:
        parser.error(f"--profile-set wants FIELD=VALUE, got {item!r}")
    try:
        return name, int(text)
    except ValueError:
        try:
            return name, float(text)
        except ValueError:
            parser.error(f"--profile-set {name}: {text!r} is not a number")
    raise AssertionError  # pragma: no cover - parser.error exits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration-s", type=float, default=None, help="seconds per flood (default 180, or the shape file's)"
    )
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds (default 0,1, or the shape file's)"
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="batch agents (default: the shape's, 48 or 6)"
    )
    parser.add_argument(
        "--interactive", type=int, default=None, help="interactive agents (default: the shape's, 4 or 1)"
    )
    parser.add_argument(
        "--slots",
        default=None,
        help="running requests per engine at most, or none (default: none, or the shape file's)",
    )
    parser.add_argument(
        "--profile", default=None, help=f"engine model profile (default {PROFILE}, or the shape file's)"
    )
    parser.add_argument(
        "--queue",
        choices=QUEUES,
        default=None,
        help="the engines' waiting-queue order, every arrangement alike (default fcfs, or the shape file's)",
    )
    parser.add_argument(
        "--pool-scale",
        type=float,
        default=None,
        help="multiply the profile's KV pool (default 1, or the shape file's)",
    )
    parser.add_argument(
        "--smg-capacity",
        choices=("reported", "load"),
        default="reported",
        help="SGLang Model Gateway's slot pool: the engines' reported bound, or set for the load",
    )
    parser.add_argument(
        "--profile-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of the engine profile (repeatable), e.g. pool_tokens=4096",
    )
    parser.add_argument(
        "--shape",
        default="published",
        help="published (the published table's load, default), llamacpp (the REAL ENGINE llama.cpp "
        "flood's) or the path of a load shape file (.toml)",
    )
    parser.add_argument("--via", choices=("own_loop", "mcp"), default="own_loop")
    parser.add_argument("--tool-seconds", type=float, default=0.5, help="seconds per tool call (default 0.5)")
    parser.add_argument(
        "--tool-rounds", type=int, default=None, help="tool rounds per run (default: the shape's)"
    )
    parser.add_argument(
        "--tool-rounds-by",
        choices=("model", "agent"),
        default=None,
        help="agent: the proxy sees no tool call, runs are idle between turns (default: the shape's)",
    )
    parser.add_argument("--cutoff-every", type=int, default=0, help="cut every N-th run off in a tool call")
    parser.add_argument(
        "--hold", choices=HOLD_MODES, default="cost", help="luftpause's pause hold (default cost)"
    )
    parser.add_argument(
        "--idle",
        choices=IDLE_MODES,
        default="wait",
        help="luftpause's soft affinity for idle runs (default wait)",
    )
    parser.add_argument(
        "--idle-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a setting of the idle affinity (repeatable): window_s, factor, min_s, max_s, default_s, "
        "shared (0 or 1)",
    )
    parser.add_argument(
        "--run-order",
        choices=("run", "turn", "plas"),
        default="run",
        help="luftpause's run order (default run)",
    )
    parser.add_argument("--smg-interactive-floor", type=int, default=None, help="smg's interactive floor")
    parser.add_argument("--smg-preempt", action="store_true", help="smg preempts bulk turns before TTFT")
    parser.add_argument(
        "--arrangements", default=",".join(ARRANGEMENTS), help=f"of {', '.join(ARRANGEMENTS)}"
    )
    parser.add_argument("--replay", metavar="TRACE", help="replay a trace the scheduler recorded")
    parser.add_argument("--no-control", action="store_true", help="skip the light-load control")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    arrangements = [a for a in args.arrangements.split(",") if a]
    if unknown := [a for a in arrangements if a not in ARRANGEMENTS]:
        parser.error(f"unknown arrangements {unknown}; choose from {ARRANGEMENTS}")
    shape_file: ShapeFile | None = None
    if args.shape not in ("published", "llamacpp"):
        if args.batch is not None or args.interactive is not None:
            parser.error("--batch and --interactive are for the built-in shapes; a shape file has its groups")
        try:
            shape_file = load_shape_file(Path(args.shape))
        except ShapeError as error:
            parser.error(str(error))
    default_seeds = ",".join(map(str, shape_file.seeds)) if shape_file else "0,1"
    seeds = [int(s) for s in (args.seeds or default_seeds).split(",") if s]
    if args.slots is not None:
        slots = None if args.slots == "none" else int(args.slots)
    else:
        slots = shape_file.slots if shape_file else None
    idle_changes: dict[str, Any] = dict(_field_value(item, parser) for item in args.idle_set)
    spec: dict[str, Any] = {
        "profile": args.profile or (shape_file.profile if shape_file else PROFILE),
        "profile_changes": dict(_field_value(item, parser) for item in args.profile_set),
        "slots": slots,
        "replicas": shape_file.replicas if shape_file else 2,
        "queue": args.queue or (shape_file.queue if shape_file else "fcfs"),
        "pool_scale": args.pool_scale or (shape_file.pool_scale if shape_file else 1.0),
        "smg_capacity": args.smg_capacity,
        "gateway": GatewaySettings(interactive_floor=args.smg_interactive_floor, preempt=args.smg_preempt),
        "policy": {
            "pause_hold": PauseHold(mode=args.hold),
            "run_order": args.run_order,
            "idle_affinity": dataclasses.replace(IdleAffinity(args.idle), **idle_changes),
        },
    }
    changes: dict[str, Any] = {"tool_seconds": args.tool_seconds}
    if args.tool_rounds is not None:
        changes["tool_rounds"] = args.tool_rounds
    if args.tool_rounds_by is not None:
        changes["tool_calls_seen"] = args.tool_rounds_by == "model"

    llama = args.shape == "llamacpp"
    interactive = args.interactive if args.interactive is not None else (1 if llama else 4)
    batch = args.batch if args.batch is not None else (6 if llama else 48)
    duration_s = args.duration_s or (shape_file.load.duration_s if shape_file else 180.0)

    def shape_of(batch: int, **more: Any) -> LoadShape:
        if shape_file is not None:
            load = shape_file.load
            groups = load.groups if batch else tuple(g for g in load.groups if g.service_class != "batch")
            return dataclasses.replace(load, groups=groups, duration_s=duration_s, **more)
        if llama:
            return llamacpp_shape(interactive, batch, duration_s, **changes, **more)
        return published_shape(interactive, batch, duration_s, via=args.via, **changes, **more)

    shape: LoadShape | Trace
    if args.replay:
        shape = replay_shape(load_trace(Path(args.replay)))
    else:
        shape = shape_of(batch, cutoff_every=args.cutoff_every)
    started = time.monotonic()
    result: dict[str, Any] = {
        "simulated": True,
        "settings": {
            "argv": sys.argv[1:] if argv is None else argv,
            "profile": spec["profile"],
            "slots": slots,
            "queue": spec["queue"],
            "poolScale": spec["pool_scale"],
            "shapeFile": args.shape if shape_file else None,
            "seeds": seeds,
            "shape": repr(shape),
        },
    }
    result["flood"] = series(shape, arrangements, seeds, **spec)
    print(render("Interactive under a batch flood", result["flood"]))
    if not args.no_control and not args.replay:
        control = shape_of(0)
        result["control"] = series(control, arrangements, seeds, **spec)
        print(render("Light-load control (interactive agents alone)", result["control"]))
    print(f"({time.monotonic() - started:.1f} s of wall time)", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
