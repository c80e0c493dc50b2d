"""A matrix of load shapes, every arrangement in each, in virtual time: one table.

    .venv/bin/python bench/flood_matrix.py                                  # every bench/shapes/*.toml
    .venv/bin/python bench/flood_matrix.py --shapes bench/shapes/published.toml,bench/shapes/lpm.toml \
        --seeds 0 --duration-s 90 --json /tmp/matrix.json

Each shape file (:mod:`luftpause.testkit.sim.shapes`) is run as ``bench/flood_sim.py --shape``
runs it, under every arrangement of ``--arrangements`` (default: SGLang's router, SGLang Model
Gateway with its slot pool set for the load (``--worker-capacity-override``), ThunderAgent,
Continuum, luftpause), on the same engines and settings, medians over the shape's seeds (or
``--seeds``). Per shape and arrangement: interactive and batch runs/min, their total, the
interactive run time's p50, the prompt tokens cached; then luftpause's ratios against the best
peer on each figure (the highest runs/min, the lowest p50; the peer named) and against the router.
A light-load control (the shape's interactive agents alone, under the router) says whether the
flood matters in that shape: the router's interactive p50 on the flood above twice the control's,
or no interactive run ended on the flood in a window where the control's did.
The judgement is the same whichever arrangements are asked: when ``--arrangements`` leaves the
router out, the router is run on the flood anyway for its p50 (``routerP50``), and its row is not
shown. A ratio with no figure (or 0 over 0) renders as an en dash and the peer (``NO_RATIO``, no
"x"), one over a peer's 0 (a peer at 0 runs/min) as ``inf (PEER 0)``, ``"inf"`` in the JSON.

Every figure is SIMULATED. ``--json PATH`` writes ``{"simulated": true, "settings", "shapes":
[{"shape", "file", "floodMatters", "routerP50", "controlP50", "rows": [flood_sim rows],
"luftpause": {figure: {"bestPeer", "vsBestPeer", "vsRouter"}}}]}``, each ratio a number,
``"inf"`` or ``null``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from flood_sim import series

from luftpause.testkit.sim.flood import ARRANGEMENTS, PEERS
from luftpause.testkit.sim.shapes import ShapeError, ShapeFile, load_shape_file

SHAPES = Path(__file__).parent / "shapes"
DEFAULT_ARRANGEMENTS = ("router", "smg", "thunderagent", "continuum", "luftpause")
HIGHER = ("interactiveRunsPerMinute", "batchRunsPerMinute", "totalRunsPerMinute")
LOWER = ("interactiveRunTimeP50",)
NO_RATIO = "\u2013"
"""An en dash: the cell of a ratio with no figure behind it (never ``-x``)."""


def run_shape(
    shape: ShapeFile, arrangements: list[str], seeds: list[int], duration_s: float | None
) -> dict[str, Any]:
    """Every arrangement on ``shape``, and the router alone on its light-load control."""
    load = shape.load
    if duration_s is not None:
        load = dataclasses.replace(load, duration_s=duration_s)
    spec: dict[str, Any] = {
        "profile": shape.profile,
        "slots": shape.slots,
        "replicas": shape.replicas,
        "queue": shape.queue,
        "pool_scale": shape.pool_scale,
        "smg_capacity": "load",
    }
    rows = series(load, arrangements, seeds, **spec)
    router = next((r for r in rows if r["arrangement"] == "router"), None)
    if router is None:  # not asked for, but the judgement below needs its p50 on the flood
        router = series(load, ["router"], seeds, **spec)[0]
    control_load = dataclasses.replace(
        load, groups=tuple(g for g in load.groups if g.service_class == "interactive")
    )
    control = series(control_load, ["router"], seeds, **spec)[0]
    router_p50 = router["interactiveRunTimeP50"]
    control_p50 = control["interactiveRunTimeP50"]
    for row in rows:
        row.pop("seeds")
    return {
        "shape": shape.name,
        "floodMatters": flood_matters(router_p50, control_p50),
        "routerP50": router_p50,
        "controlP50": control_p50,
        "rows": rows,
        "luftpause": ratios(rows),
    }


def flood_matters(router_p50: float | None, control_p50: float | None) -> bool:
    """Whether the flood slows the router's interactive runs: its interactive run time p50 on the
    flood (seconds) above twice its p50 on the light-load control, or no interactive run ended on
    the flood (``router_p50`` None) in a window where the control's did. ``False`` when the control
    has no p50 (no interactive agents, or a window too short for a run)."""
    if control_p50 is None:
        return False
    return router_p50 is None or router_p50 > 2 * control_p50


def _divide(numerator: float, denominator: float) -> float | str | None:
    """``numerator / denominator`` to 3 places; ``"inf"`` over a 0 denominator, ``None`` for 0 / 0."""
    if denominator:
        return round(numerator / denominator, 3)
    return "inf" if numerator else None


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """luftpause's figures over the best peer's (named) and over the router's, per figure."""
    ours = next((r for r in rows if r["arrangement"] == "luftpause"), None)
    peers = [r for r in rows if r["arrangement"] in PEERS]
    if ours is None or not peers:
        return {}
    result: dict[str, Any] = {}
    for key in HIGHER + LOWER:
        present = [r for r in peers if r[key] is not None]
        if ours[key] is None or not present:
            continue
        if key in HIGHER:
            best = max(present, key=lambda r: r[key])
            ratio = _divide(ours[key], best[key])
        else:
            best = min(present, key=lambda r: r[key])
            ratio = _divide(best[key], ours[key])  # above 1: luftpause is faster
        router = next((r for r in present if r["arrangement"] == "router"), None)
        versus_router = None
        if router is not None:
            if key in HIGHER:
                versus_router = _divide(ours[key], router[key])
            else:
                versus_router = _divide(router[key], ours[key])
        result[key] = {"bestPeer": best["arrangement"], "vsBestPeer": ratio, "vsRouter": versus_router}
    return result


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ratio(value: float | str | None, peer: str) -> str:
    """A ratio of :func:`ratios` over ``peer``: ``1.23x router``, ``inf (router 0)``, or
    :data:`NO_RATIO` and the peer when there is none."""
    if value is None:
        return f"{NO_RATIO} {peer}"
    if value == "inf":
        return f"inf ({peer} 0)"
    return f"{float(value):.2f}x {peer}"


def render(results: list[dict[str, Any]]) -> str:
    """One markdown table: a row per shape and arrangement, luftpause's ratios on its own row."""
    lines = [
        "| shape | arrangement | interactive runs/min | batch runs/min | total runs/min "
        "| interactive p50 s | cache hits |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        name = result["shape"] + ("" if result["floodMatters"] else " (no flood)")
        for row in result["rows"]:
            lines.append(
                f"| {name} | {row['arrangement']} | {_cell(row['interactiveRunsPerMinute'], '.1f')} "
                f"| {_cell(row['batchRunsPerMinute'], '.1f')} | {_cell(row['totalRunsPerMinute'], '.1f')} "
                f"| {_cell(row['interactiveRunTimeP50'], '.2f')} | {_cell(row['cacheHitRate'], '.1%')} |"
            )
            name = ""
        mine = result["luftpause"]
        if mine:
            cells = []
            for key in (
                "interactiveRunsPerMinute",
                "batchRunsPerMinute",
                "totalRunsPerMinute",
                "interactiveRunTimeP50",
            ):
                entry = mine.get(key)
                if entry is None:
                    cells.append(NO_RATIO)
                else:
                    versus_best = _ratio(entry["vsBestPeer"], entry["bestPeer"])
                    cells.append(f"{versus_best}; {_ratio(entry['vsRouter'], 'router')}")
            lines.append(f"| | luftpause vs best peer; vs router | {' | '.join(cells)} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default=None,
        help="comma-separated shape files (default: every bench/shapes/*.toml)",
    )
    parser.add_argument(
        "--arrangements",
        default=",".join(DEFAULT_ARRANGEMENTS),
        help=f"of {', '.join(ARRANGEMENTS)} (default {','.join(DEFAULT_ARRANGEMENTS)})",
    )
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: each shape's)")
    parser.add_argument(
        "--duration-s", type=float, default=None, help="seconds per flood (default: each shape's)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    arrangements = [a for a in args.arrangements.split(",") if a]
    if unknown := [a for a in arrangements if a not in ARRANGEMENTS]:
        parser.error(f"unknown arrangements {unknown}; choose from {ARRANGEMENTS}")
    paths = [Path(p) for p in args.shapes.split(",") if p] if args.shapes else sorted(SHAPES.glob("*.toml"))
    try:
        shapes = [load_shape_file(path) for path in paths]
    except ShapeError as error:
        parser.error(str(error))
    started = time.monotonic()
    results = []
    for path, shape in zip(paths, shapes, strict=True):
        seeds = [int(s) for s in args.seeds.split(",") if s] if args.seeds else list(shape.seeds)
        result = run_shape(shape, arrangements, seeds, args.duration_s)
        result["file"] = str(path)
        result["seeds"] = seeds
        results.append(result)
        print(f"{shape.name}: done ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    print("Flood matrix (SIMULATED; medians over seeds)")
    print(render(results))
    if args.json:
        settings = {"argv": sys.argv[1:] if argv is None else argv, "arrangements": arrangements}
        Path(args.json).write_text(
            json.dumps({"simulated": True, "settings": settings, "shapes": results}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
