"""What the end-to-end overhead benchmark measures around the load: CPU seconds of each
arrangement's process groups (``utime + stime`` from ``/proc/<pid>/stat``), peak RSS (``VmHWM``),
and the pooled :class:`Measurement` of every arrangement, concurrency and mode over rounds.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from e2e_arrangements import Arrangement
from e2e_load import closed_loop

from luftpause.testkit.launch.procs import ChildProcess, stat_fields

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STREAMED = "stream"
WHOLE = "whole"


def cpu_seconds(children: Sequence[ChildProcess]) -> float:
    """CPU seconds (user + system) used so far by every live process of ``children``' groups."""
    total = 0
    for child in children:
        for pid in child.group_pids():
            fields = stat_fields(pid)
            if fields is not None:
                total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLOCK_TICKS


def memory_of(children: Sequence[ChildProcess]) -> list[dict[str, Any]]:
    """Per process of ``children``' groups: pid, command line, ``VmHWM`` and ``VmRSS`` in bytes."""
    rows = []
    for child in children:
        for pid in child.group_pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            kb = {
                key: int(value.split()[0])
                for key, _, value in (line.partition(":") for line in status.splitlines())
                if key in ("VmHWM", "VmRSS")
            }
            rows.append(
                {
                    "process": child.name,
                    "pid": pid,
                    "cmdline": cmdline.strip()[:120],
                    "peak_rss_bytes": kb.get("VmHWM", 0) * 1024,
                    "rss_bytes": kb.get("VmRSS", 0) * 1024,
                }
            )
    return rows


@dataclass
class Measurement:
    """One arrangement at one concurrency and mode, pooled over rounds."""

    arrangement: str
    streams: int
    mode: str
    ttfts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    proxy_cpu_s: float = 0.0
    proxy_cpu_s_by_process: dict[str, float] = field(default_factory=dict)
    engine_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    round_cps: list[float] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.ttfts)

    @property
    def cps(self) -> float:
        return self.turns / self.seconds if self.seconds else math.nan

    def per_1k(self, cpu_s: float) -> float:
        return cpu_s / self.turns * 1000 if self.turns else math.nan


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (``fraction`` from 0 to 1); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


async def measure(
    arrangement: Arrangement,
    engine: ChildProcess,
    streams: int,
    mode: str,
    args: argparse.Namespace,
    into: Measurement,
    tag: str,
) -> None:
    """Warm up, then one measured closed loop of ``args.turns`` turns, added to ``into``."""
    assert arrangement.url is not None
    stream = mode == STREAMED
    connector = aiohttp.TCPConnector(limit=streams, limit_per_host=streams)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warm = await closed_loop(session, arrangement.url, streams, args.warmup, stream, args.max_tokens, tag)
        into.errors.extend(f"warm-up: {e}" for e in warm.errors[:3])
        proxy0, engine0, client0 = (
            _cpu_by_child(arrangement.children),
            cpu_seconds([engine]),
            time.process_time(),
        )
        result = await closed_loop(
            session, arrangement.url, streams, args.turns, stream, args.max_tokens, tag
        )
        proxy1, engine1, client1 = (
            _cpu_by_child(arrangement.children),
            cpu_seconds([engine]),
            time.process_time(),
        )
    into.ttfts.extend(result.ttfts)
    into.errors.extend(result.errors)
    into.seconds += result.seconds
    for name, seconds in proxy1.items():
        used = seconds - proxy0.get(name, 0.0)
        into.proxy_cpu_s += used
        into.proxy_cpu_s_by_process[name] = into.proxy_cpu_s_by_process.get(name, 0.0) + used
    into.engine_cpu_s += engine1 - engine0
    into.client_cpu_s += client1 - client0
    into.round_cps.append(len(result.ttfts) / result.seconds)


def _cpu_by_child(children: Sequence[ChildProcess]) -> dict[str, float]:
    """CPU seconds so far per child name (each child's whole process group)."""
    return {child.name: cpu_seconds([child]) for child in children}


async def run_all(
    arrangements: list[Arrangement], engine: ChildProcess, args: argparse.Namespace
) -> dict[tuple[int, str, str], Measurement]:
    """Every measured arrangement at every concurrency and mode, ``args.rounds`` times, the order of
    arrangements rotated by one place per round and per cell."""
    measured = [a for a in arrangements if a.url is not None]
    cells = [
        (streams, mode) for streams in args.streams for mode in getattr(args, "modes", (STREAMED, WHOLE))
    ]
    results = {
        (streams, mode, a.name): Measurement(a.name, streams, mode)
        for streams, mode in cells
        for a in measured
    }
    for round_index in range(args.rounds):
        for cell_index, (streams, mode) in enumerate(cells):
            shift = (round_index + cell_index) % len(measured)
            for arrangement in measured[shift:] + measured[:shift]:
                print(
                    f"round {round_index + 1}/{args.rounds}: {streams:>3} streams, {mode:<6} "
                    f"{arrangement.name}",
                    file=sys.stderr,
                    flush=True,
                )
                tag = f"r{round_index}-{streams}-{mode}-{arrangement.name}"
                await measure(
                    arrangement, engine, streams, mode, args, results[(streams, mode, arrangement.name)], tag
                )
    return results
