"""Soak: does the dataplane worker's memory level off (bounded caches) or keep growing (a leak)?

The issue saw the dataplane worker's RSS grow from 68.9 to 78.6 MB over a 5-minute soak at 64
agents, unexplained. The dataplane keeps three things per run for a while: its run table (a run
idle for ``RUN_IDLE_EXPIRY_S``, 30 min, is forgotten), the ``tool_call_id -> run`` table (30 min)
and the runs ended by ``DELETE`` (as long as the ids' ttl). A soak of 5 minutes sees them fill and
never empty, bounded or not. So this runs the same soak with those expiries scaled down to
``--expiry-s`` (default 60 s; pruned every ``--expiry-s / 6``), long enough for several expiries:
a bounded cache levels off after one expiry, a leak keeps its slope. The same run with the real
expiries is the control, so both are measured on the same machine in the same session.

Each soak: two simulated engines (SIMULATED), the scheduler, and a dataplane whose constants are
patched before granian forks its worker (so the worker has them); ``luftpause loadgen --agents N``
drives closed-loop own-loop agents (each run: ``--tool-rounds`` tool rounds, then a new run)
through it for ``--duration-s``. The worker's RSS (``/proc/<pid>/status`` VmRSS) is sampled every
``--sample-s``; with ``--tracemalloc``, the worker also traces Python allocations and dumps a
snapshot at every sample (SIGUSR2), and the report diffs the snapshot after the first expiry with
the last one, by file and line (tracemalloc costs CPU and memory itself: its RSS figures are not
comparable with a run without it).

Printed and written with ``--json``: per soak, RSS at each sample, the growth per minute in the
first and the second half of the soak, the run table's size at the end (the dataplane's
``/health``), and with ``--tracemalloc`` the top growths.

    .venv/bin/python bench/soak.py [--agents 64] [--duration-s 360] [--expiry-s 60] [--control]
                                   [--tracemalloc] [--sample-s 15] [--json PATH]

``--stack`` soaks every process instead: ``luftpause up --config FILE --simulate`` (two simulated
engines, the fake MCP server, scheduler, dataplane, runtime) with the retention windows shortened by
configuration alone (``[scheduler] run_expiry_s`` and ``[dataplane] run_expiry_s`` set to
``--expiry-s``; ``[runtime] retained_bytes`` to ``--retained-bytes`` and ``retained_s`` to
``--expiry-s`` too), own-loop agents through the
dataplane (``--agents``) and, at the same time, sub-agents through the runtime (``luftpause loadgen
--spawn --spawn-agents``, one pass after another until the end). The RSS of every process (each
process with its granian workers) is sampled every ``--sample-s``; the report gives each one's
slope in the first and the second half.

    .venv/bin/python bench/soak.py --stack [--agents 8] [--spawn-agents 4] [--duration-s 2400]
                                   [--expiry-s 120] [--retained-bytes 2097152] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import ChildProcess, free_port, group_pids, stat_fields

# The dataplane under test: its expiries patched, then served as `luftpause dataplane` serves it.
# granian forks its worker from this process, so the worker sees the patched module constants;
# SIGUSR2 in the worker dumps a tracemalloc snapshot when tracing (PYTHONTRACEMALLOC is set).
_DATAPLANE = r"""
import functools, os, signal, sys, tracemalloc
expiry = float(sys.argv[1])
snapshots = sys.argv[2]
import luftpause.dataplane.wiring as wiring
import luftpause.dataplane.runs as runs
from luftpause.tool_calls import ToolCallTable
if expiry > 0:
    runs.RUN_IDLE_EXPIRY_S = expiry
    wiring.PRUNE_EVERY_S = expiry / 6
    wiring.ToolCallTable = functools.partial(ToolCallTable, ttl_s=expiry)
if snapshots:
    counter = [0]
    def dump(signum, frame):
        counter[0] += 1
        tracemalloc.take_snapshot().dump(os.path.join(snapshots, f"{os.getpid()}-{counter[0]:04d}.snap"))
    signal.signal(signal.SIGUSR2, dump)
from luftpause.cli import main
sys.exit(main(["dataplane", "--config", sys.argv[3]]))
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def worker_of(main: int) -> int:
    """The granian worker process of the dataplane whose main process is ``main``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = stat_fields(int(entry))
                if fields is not None and int(fields[1]) == main:
                    return int(entry)
        time.sleep(0.1)
    raise RuntimeError("the dataplane started no worker")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return orjson.loads(response.read())


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return 60 * cov / var if var else 0.0


def top_growth(first: Path, last: Path, limit: int = 12) -> list[dict[str, Any]]:
    """The allocation sites (file:line) that grew most between two snapshots."""
    keep = [
        tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    before = tracemalloc.Snapshot.load(str(first)).filter_traces(keep)
    after = tracemalloc.Snapshot.load(str(last)).filter_traces(keep)
    out = []
    grown = sorted(after.compare_to(before, "lineno"), key=lambda stat: stat.size_diff, reverse=True)
    for stat in grown[:limit]:
        frame = stat.traceback[0]
        out.append(
            {
                "where": f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}",
                "grew_kib": round(stat.size_diff / 1024, 1),
                "now_kib": round(stat.size / 1024, 1),
                "blocks_grew": stat.count_diff,
            }
        )
    return out


def soak(args: argparse.Namespace, expiry_s: float, workdir: Path) -> dict[str, Any]:
    """One soak with expiries ``expiry_s`` (0: the real ones)."""
    workdir.mkdir(parents=True, exist_ok=True)
    engine_ports = [free_port(), free_port()]
    grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
    replicas = "".join(
        f'[[replicas]]\nname = "sim-{i}"\nurl = "http://127.0.0.1:{port}"\nmodels = ["{DEFAULT_MODEL}"]\n'
        for i, port in enumerate(engine_ports)
    )
    config = workdir / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{grpc_port}"\nhttp = "127.0.0.1:{status_port}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{dp_port}"\nscheduler = "127.0.0.1:{grpc_port}"\n{replicas}'
    )
    snapshots = workdir / "snapshots"
    env = {"LUFTPAUSE_TOKEN": ""}
    if args.tracemalloc:
        snapshots.mkdir(exist_ok=True)
        env["PYTHONTRACEMALLOC"] = "1"
    children = [
        ChildProcess(
            f"engine{i}",
            ["fake-engine", "--port", str(port), "--model", DEFAULT_MODEL, "--slots", str(args.slots)],
            workdir / f"engine{i}.log",
            ready_url=f"http://127.0.0.1:{port}/health",
            env={"LUFTPAUSE_TOKEN": ""},
        )
        for i, port in enumerate(engine_ports)
    ]
    children.append(
        ChildProcess(
            "scheduler",
            ["scheduler", "--config", str(config)],
            workdir / "scheduler.log",
            ready_url=f"http://127.0.0.1:{status_port}/health",
            env={"LUFTPAUSE_TOKEN": ""},
        )
    )
    dataplane = ChildProcess(
        "dataplane",
        ["-c", _DATAPLANE, str(expiry_s), str(snapshots) if args.tracemalloc else "", str(config)],
        workdir / "dataplane.log",
        ready_url=f"http://127.0.0.1:{dp_port}/health",
        env=env,
        program=(sys.executable,),
    )
    children.append(dataplane)
    load: subprocess.Popen[bytes] | None = None
    try:
        for child in children:
            child.start()
            child.wait_ready(120)
        assert dataplane.proc is not None
        worker = worker_of(dataplane.proc.pid)
        base = f"http://127.0.0.1:{dp_port}"
        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "luftpause",
                "loadgen",
                "--agents",
                str(args.agents),
                "--duration-s",
                str(args.duration_s),
                "--proxy",
                base,
                "--tool-rounds",
                str(args.tool_rounds),
                "--tool-seconds",
                str(args.tool_seconds),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "LUFTPAUSE_TOKEN": ""},
        )
        started = time.monotonic()
        samples: list[tuple[float, float]] = []
        while load.poll() is None:
            at = time.monotonic() - started
            samples.append((round(at, 1), round(rss_mb(worker), 2)))
            if args.tracemalloc:
                os.kill(worker, signal.SIGUSR2)
            print(
                f"  expiry {expiry_s or 'real'}: {at:5.0f} s  worker RSS {samples[-1][1]:.1f} MB", flush=True
            )
            time.sleep(args.sample_s)
        out, _ = load.communicate()
        health = get_json(f"{base}/health")
        half = args.duration_s / 2
        result: dict[str, Any] = {
            "expiry_s": expiry_s or "real (runs 1800 s, tool-call ids 1800 s)",
            "rss_mb": samples,
            "rss_first_mb": samples[0][1] if samples else None,
            "rss_last_mb": samples[-1][1] if samples else None,
            "slope_first_half_mb_per_min": round(slope_mb_per_min([s for s in samples if s[0] <= half]), 2),
            "slope_second_half_mb_per_min": round(slope_mb_per_min([s for s in samples if s[0] > half]), 2),
            "runs_in_table_at_end": health.get("runs"),
            "loadgen": orjson.loads(out) if out.strip() else None,
        }
        if args.tracemalloc:
            snaps = sorted(snapshots.glob(f"{worker}-*.snap"))
            # the first snapshot past one expiry (caches full) against the last one
            settle = expiry_s * 1.5 if expiry_s else half
            first = next(
                (snap for snap, (t, _) in zip(snaps, samples, strict=False) if t >= settle), snaps[0]
            )
            result["tracemalloc_growth"] = top_growth(first, snaps[-1]) if len(snaps) > 1 else []
        return result
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()
        for child in reversed(children):
            child.stop()


_COMMANDS = frozenset({"fake-engine", "fake-mcp", "scheduler", "dataplane", "runtime"})


def tree_rss_mb(leader: int) -> float:
    """RSS of process group ``leader`` (a child of ``up``, in its own session: the process and its
    granian workers), in MB."""
    total = 0.0
    for pid in group_pids(leader):
        try:
            total += rss_mb(pid)
        except (OSError, RuntimeError):
            pass  # gone between the listing and the read
    return total


def up_children(up: int) -> dict[str, int]:
    """The processes ``luftpause up`` (pid ``up``) started, by their command (``fake-engine
    --port 9101``, ``dataplane``, ...), each its process group leader."""
    named: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is None or int(fields[1]) != up:
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # a server that sets its title (granian) writes it as one string: split on spaces too
        words = b" ".join(argv).decode(errors="replace").split()
        # python -m luftpause <command> ..., or a server's own title (luftpause <command> ...)
        at = words.index("luftpause") if "luftpause" in words else 0 if words[0].endswith("luftpause") else -1
        if at < 0 or at + 1 >= len(words) or words[at + 1] not in _COMMANDS:
            continue  # not one of the stack's processes (up's reaper)
        port = words[words.index("--port") + 1] if "--port" in words else ""
        named[f"{words[at + 1]} {port}".strip()] = int(entry)
    return named


def soak_stack(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every process of ``luftpause up`` under a steady load, retention shortened by configuration."""
    workdir.mkdir(parents=True, exist_ok=True)
    engines = [free_port(), free_port()]
    mcp, grpc_port, status_port, dp_port, rt_port = (free_port() for _ in range(5))
    replicas = "".join(
        f'[[replicas]]\nname = "sim-{i}"\nurl = "http://127.0.0.1:{port}"\nmodels = ["{DEFAULT_MODEL}"]\n'
        for i, port in enumerate(engines)
    )
    config = workdir / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{grpc_port}"\nhttp = "127.0.0.1:{status_port}"\n'
        f"run_expiry_s = {args.expiry_s}\n"
        f'[dataplane]\nlisten = "127.0.0.1:{dp_port}"\nscheduler = "127.0.0.1:{grpc_port}"\n'
        f"run_expiry_s = {args.expiry_s}\n"
        f'[runtime]\nlisten = "127.0.0.1:{rt_port}"\ndataplane = "http://127.0.0.1:{dp_port}"\n'
        f'state_dir = "{workdir / "state"}"\ndefault_model = "{DEFAULT_MODEL}"\n'
        f"retained_bytes = {args.retained_bytes}\n"
        f"retained_s = {args.expiry_s}\n"
        f'{replicas}[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:{mcp}/mcp"\n'
    )
    env = {"LUFTPAUSE_TOKEN": ""}
    up = ChildProcess(
        "up",
        ["up", "--config", str(config), "--simulate", "--logs", str(workdir / "logs")],
        workdir / "up.log",
        ready_url=f"http://127.0.0.1:{rt_port}/readyz",
        env=env,
    )
    loads: list[subprocess.Popen[bytes]] = []
    spawner: subprocess.Popen[bytes] | None = None
    try:
        up.start()
        up.wait_ready(180)
        assert up.proc is not None
        time.sleep(2)
        children = up_children(up.proc.pid)
        base = f"http://127.0.0.1:{dp_port}"
        agents = subprocess.Popen(
            [sys.executable, "-m", "luftpause", "loadgen", "--agents", str(args.agents),
             "--duration-s", str(args.duration_s), "--proxy", base, "--tool-rounds",
             str(args.tool_rounds), "--tool-seconds", str(args.tool_seconds), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, **env},
        )  # fmt: skip
        loads.append(agents)
        spawn_cmd = [sys.executable, "-m", "luftpause", "loadgen", "--config", str(config),
                     "--spawn", str(args.spawn_agents), "--json", "--timeout", "300"]  # fmt: skip
        started = time.monotonic()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in children}
        spawn_passes = spawn_failures = 0
        while agents.poll() is None:
            at = round(time.monotonic() - started, 1)
            if spawner is None or spawner.poll() is not None:
                if spawner is not None:
                    spawn_passes += 1
                    spawn_failures += spawner.returncode != 0
                if at < args.duration_s - 30:
                    spawner = subprocess.Popen(
                        spawn_cmd,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env={**os.environ, **env},
                    )
            for name, leader in children.items():
                samples[name].append((at, round(tree_rss_mb(leader), 2)))
            print(
                f"  {at:6.0f} s  " + "  ".join(f"{n} {s[-1][1]:.1f}" for n, s in samples.items()), flush=True
            )
            time.sleep(args.sample_s)
        out, _ = agents.communicate()
        half = args.duration_s / 2
        processes = {
            name: {
                "rss_first_mb": s[0][1] if s else None,
                "rss_last_mb": s[-1][1] if s else None,
                "rss_max_mb": max(m for _, m in s) if s else None,
                "slope_first_half_mb_per_min": round(slope_mb_per_min([x for x in s if x[0] <= half]), 3),
                "slope_second_half_mb_per_min": round(slope_mb_per_min([x for x in s if x[0] > half]), 3),
                "rss_mb": s,
            }
            for name, s in samples.items()
        }
        return {
            "expiry_s": args.expiry_s,
            "retained_bytes": args.retained_bytes,
            "processes": processes,
            "spawn_passes": spawn_passes,
            "spawn_passes_failed": spawn_failures,
            "loadgen": orjson.loads(out) if out.strip() else None,
            "dataplane_health_at_end": get_json(f"{base}/health"),
        }
    finally:
        for proc in [*loads, *([spawner] if spawner is not None else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        up.stop(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=360.0)
    parser.add_argument(
        "--expiry-s", type=float, default=60.0, help="run and tool-call expiry of the scaled soak"
    )
    parser.add_argument("--control", action="store_true", help="also soak with the real expiries (30 min)")
    parser.add_argument("--tracemalloc", action="store_true", help="diff Python allocations in the worker")
    parser.add_argument("--sample-s", type=float, default=15.0)
    parser.add_argument("--slots", type=int, default=16, help="running slots per simulated engine")
    parser.add_argument("--tool-rounds", type=int, default=2)
    parser.add_argument("--tool-seconds", type=float, default=0.2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--stack", action="store_true", help="every process of luftpause up (see above)")
    parser.add_argument("--spawn-agents", type=int, default=4, help="--stack: sub-agents per spawn pass")
    parser.add_argument(
        "--retained-bytes", type=int, default=2 * 1024 * 1024, help="--stack: [runtime] retained_bytes"
    )
    args = parser.parse_args()
    if args.stack:
        with tempfile.TemporaryDirectory(prefix="soak-stack-") as tmp:
            stack = soak_stack(args, Path(tmp) / "stack")
        report = {"engine": "SIMULATED", "args": vars(args) | {"json": str(args.json)}, "stack": stack}
        for name, p in stack["processes"].items():
            print(
                f"{name}: RSS {p['rss_first_mb']} -> {p['rss_last_mb']} MB (max {p['rss_max_mb']}); slope "
                f"{p['slope_first_half_mb_per_min']} MB/min (first half), "
                f"{p['slope_second_half_mb_per_min']} MB/min (second half)"
            )
        if args.json is not None:
            args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        return 0
    results: dict[str, Any] = {
        "engine": "SIMULATED",
        "load_average": os.getloadavg(),
        "args": vars(args) | {"json": str(args.json)},
    }
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        results["scaled"] = soak(args, args.expiry_s, Path(tmp) / "scaled")
        if args.control:
            results["control"] = soak(args, 0.0, Path(tmp) / "control")
    results["load_average_after"] = os.getloadavg()
    for name in ("scaled", "control"):
        if name in results:
            r = results[name]
            print(
                f"{name}: RSS {r['rss_first_mb']} -> {r['rss_last_mb']} MB; slope "
                f"{r['slope_first_half_mb_per_min']} MB/min (first half), "
                f"{r['slope_second_half_mb_per_min']} MB/min (second half); runs in the table at the end "
                f"{r['runs_in_table_at_end']}"
            )
            for line in r.get("tracemalloc_growth", []):
                print(f"    {line['grew_kib']:>9} KiB  {line['blocks_grew']:>7} blocks  {line['where']}")
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
