"""The report of the end-to-end overhead benchmark: rows with ratios (added time to first token
against ``direct``, completions per second and CPU per turn against the nginx of as many workers:
``luftpause-w2`` against ``nginx-w2``, every other arrangement against ``nginx``), the Markdown
table, the targets of docs/architecture.md "Performance budgets", the projection for a 16-core
host, and what source was measured.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from e2e_arrangements import Source, git
from e2e_measure import STREAMED, Measurement, percentile

# Targets from docs/architecture.md "Performance budgets".
TARGET_ADDED_TTFT_S = 0.001
TARGET_CPS_VS_NGINX = 0.8
TARGET_CPU_VS_NGINX = 2.0


def _ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) and not math.isnan(value) else math.nan


def summarise(
    results: dict[tuple[int, str, str], Measurement], streams: Sequence[int]
) -> list[dict[str, Any]]:
    """One row per measurement, with ratios: added time to first token against ``direct`` and
    completions per second and CPU per turn against ``nginx`` (NaN where the baseline is absent)."""
    rows = []
    for (count, mode, name), m in results.items():
        direct = results.get((count, mode, "direct"))
        nginx = results.get((count, mode, _baseline(name)))
        p50 = percentile(m.ttfts, 0.5)
        cpu = m.per_1k(m.proxy_cpu_s) if name != "direct" else math.nan
        rows.append(
            {
                "arrangement": name,
                "workers": workers_of(name),
                "baseline": _baseline(name),
                "streams": count,
                "mode": mode,
                "turns": m.turns,
                "errors": len(m.errors),
                "first_errors": m.errors[:3],
                "ttft_p50_s": p50,
                "ttft_p99_s": percentile(m.ttfts, 0.99),
                "added_ttft_p50_s": p50 - percentile(direct.ttfts, 0.5) if direct else math.nan,
                "completions_per_s": m.cps,
                "completions_per_s_by_round": m.round_cps,
                "cps_vs_nginx": _ratio(m.cps, nginx.cps) if nginx else math.nan,
                "proxy_cpu_s_per_1k_turns": cpu,
                "proxy_cpu_s_per_1k_turns_by_process": {
                    name: m.per_1k(seconds) for name, seconds in m.proxy_cpu_s_by_process.items()
                },
                "cpu_vs_nginx": _ratio(cpu, nginx.per_1k(nginx.proxy_cpu_s)) if nginx else math.nan,
                "engine_cpu_s_per_1k_turns": m.per_1k(m.engine_cpu_s),
                "client_cpu_s_per_1k_turns": m.per_1k(m.client_cpu_s),
            }
        )
    order = {n: i for i, n in enumerate(("direct", "nginx", "luftpause", "sglang-router", "smg"))}
    rows.sort(
        key=lambda r: (
            streams.index(r["streams"]),
            r["mode"] != STREAMED,
            r["workers"],
            order.get(str(r["arrangement"]).split("-w")[0], 9),
        )
    )
    return rows


def workers_of(name: str) -> int:
    """The worker processes of arrangement ``name`` (``luftpause-w2``: 2; any other: 1)."""
    head, _, count = name.rpartition("-w")
    return int(count) if head and count.isdigit() else 1


def _baseline(name: str) -> str:
    """The nginx an arrangement is compared with: the one of as many workers."""
    workers = workers_of(name)
    return "nginx" if workers == 1 else f"nginx-w{workers}"


PROJECTED_CORES = 16


def projections(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per streamed row of a proxy: completions/s per worker (measured), and a **projection** for
    a host of ``PROJECTED_CORES`` cores, the engines and clients elsewhere, from the CPU per turn
    measured here: for luftpause, its one scheduler on one core and the dataplane's workers on
    the rest, ``min((PROJECTED_CORES - 1) / dataplane CPU s per turn, 1 / scheduler CPU s per
    turn)``; for the others ``PROJECTED_CORES / CPU s per turn``. It assumes the CPU per turn
    stays as measured (no contention between workers, no shared lock, the kernel's share as here)
    and ignores the network, the engines and the client: an upper bound from CPU, not a
    throughput seen."""
    projected = []
    for r in rows:
        if r["mode"] != STREAMED or r["arrangement"] == "direct":
            continue
        by_process = {k: v / 1000.0 for k, v in r["proxy_cpu_s_per_1k_turns_by_process"].items()}
        if "scheduler" in by_process and by_process.get("dataplane", 0) > 0 and by_process["scheduler"] > 0:
            cps = min((PROJECTED_CORES - 1) / by_process["dataplane"], 1 / by_process["scheduler"])
        else:
            cpu_s_per_turn = r["proxy_cpu_s_per_1k_turns"] / 1000.0
            ok = cpu_s_per_turn > 0 and not math.isnan(cpu_s_per_turn)
            cps = PROJECTED_CORES / cpu_s_per_turn if ok else math.nan
        projected.append(
            {
                "arrangement": r["arrangement"],
                "streams": r["streams"],
                "workers": r["workers"],
                "completions_per_s_per_worker": r["completions_per_s"] / r["workers"],
                "projected_completions_per_s": cps,
            }
        )
    by = {(p["streams"], p["arrangement"]): p for p in projected}
    for p in projected:
        nginx = by.get((p["streams"], "nginx"))
        base = nginx["projected_completions_per_s"] if nginx else math.nan
        p["projected_vs_nginx"] = _ratio(p["projected_completions_per_s"], base)
    return projected


def projection_table(projected: list[dict[str, Any]]) -> str:
    """The projections as a Markdown table."""
    lines = [
        f"| streams | arrangement | workers | completions/s per worker (measured) "
        f"| PROJECTED completions/s on {PROJECTED_CORES} cores | x nginx (projected) |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for p in projected:
        lines.append(
            f"| {p['streams']} | {p['arrangement']} | {p['workers']} "
            f"| {_fmt(p['completions_per_s_per_worker'], digits=0)} "
            f"| {_fmt(p['projected_completions_per_s'], digits=0)} | {_fmt(p['projected_vs_nginx'])} |"
        )
    return "\n".join(lines)


def _fmt(value: float, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * scale:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (milliseconds, completions/s, CPU s per 1,000 turns)."""
    lines = [
        "| streams | mode | arrangement | TTFT p50 ms | TTFT p99 ms | added p50 ms | completions/s | x nginx "
        "| proxy CPU s/1k turns | x nginx | errors |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['streams']} | {r['mode']} | {r['arrangement']} | {_fmt(r['ttft_p50_s'], 1e3)} "
            f"| {_fmt(r['ttft_p99_s'], 1e3)} | {_fmt(r['added_ttft_p50_s'], 1e3)} "
            f"| {_fmt(r['completions_per_s'], digits=0)} | {_fmt(r['cps_vs_nginx'])} "
            f"| {_fmt(r['proxy_cpu_s_per_1k_turns'])} | {_fmt(r['cpu_vs_nginx'])} "
            f"| {r['errors']} |"
        )
    return "\n".join(lines)


def targets(
    rows: list[dict[str, Any]], streams: Sequence[int], name: str = "luftpause"
) -> list[dict[str, Any]]:
    """The budgets of docs/architecture.md "Performance budgets" for arrangement ``name`` on
    streamed turns, each ``met`` True/False, or None when its concurrency or baseline was not
    measured."""
    by = {(r["streams"], r["mode"], r["arrangement"]): r for r in rows}
    checks: list[dict[str, Any]] = []

    def check(what: str, count: int, key: str, limit: float, below: bool) -> None:
        row = by.get((count, STREAMED, name))
        value = row[key] if row else math.nan
        met = None if math.isnan(value) else (value < limit if below else value >= limit)
        checks.append({"target": what, "streams": count, "value": value, "limit": limit, "met": met})

    check("added TTFT p50 (s) < 0.001", 1, "added_ttft_p50_s", TARGET_ADDED_TTFT_S, below=True)
    for count in (16, 64):
        check("completions/s vs nginx >= 0.8", count, "cps_vs_nginx", TARGET_CPS_VS_NGINX, below=False)
    for count in streams:
        check("CPU per turn vs nginx <= 2", count, "cpu_vs_nginx", TARGET_CPU_VS_NGINX + 1e-12, below=True)
    return checks


def describe_source(src: Source) -> dict[str, Any]:
    """What was measured: the commit, and for the working tree the files of ``luftpause/`` and
    ``_speedups/`` that differ from it."""
    if src.commit is not None:
        return {"commit": src.commit, "source": "exported commit", "uncommitted": []}
    changed = git("status", "--porcelain", "--", "luftpause", "_speedups").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "source": "working tree", "uncommitted": changed}


def sse_extension_loaded(src: Source) -> bool:
    """Whether the dataplane started from ``src`` takes the compiled SSE scanner."""
    probe = "from luftpause.dataplane.sse import USING_EXTENSION as u; print(u)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=src.root, env=src.env, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() == "True"
