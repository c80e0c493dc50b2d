"""End-to-end overhead of the dataplane: the same fast simulated engine reached directly, through
nginx, through luftpause (dataplane + scheduler) and through SGLang's router, in one run.

Usage::

    .venv/bin/python bench/e2e_overhead.py [--streams 1,16,64] [--turns N] [--rounds R] [--json out.json]

What is measured (DESIGN.md, "Performance budgets"): for every number of concurrent streams and
for streamed and non-streamed turns,

* time to first token p50 / p99 (seconds): from sending the request to the first SSE event whose
  delta has non-empty content, or, not streamed, to the whole body;
* completions per second over the measured turns (closed loop: each stream sends its next turn
  when its last one ends);
* CPU seconds per 1,000 turns of each proxy's processes (``utime + stime`` from
  ``/proc/<pid>/stat`` of every process in the proxy's process groups, before and after);
* the dataplane's peak RSS (``VmHWM`` of its processes, bytes), read at the end of the run, whose
  largest concurrency is the largest ``--streams``.

The arrangements:

* ``direct``: the engine itself, the baseline of time to first token;
* ``nginx``: Debian's ``/usr/sbin/nginx``, one worker (as the dataplane has one granian worker),
  ``proxy_pass`` with ``proxy_buffering off`` and keep-alive upstream connections: a hop that makes
  no decisions, the floor for throughput and CPU;
* ``luftpause``: ``luftpause scheduler`` + ``luftpause dataplane`` with one replica, the engine;
* ``sglang-router``: ``python -m sglang_router.launch_router`` when the ``sglang_router`` package
  is installed (it is not a dependency of luftpause).

An arrangement that cannot start is reported as ``not measured: <why>``, never silently left out.

Drift on a shared machine: every measurement (one arrangement, one concurrency, one mode) is
repeated ``--rounds`` times; in each round the arrangements run one after the other, their order
rotated by one place per round and per cell, so that no arrangement is always first or last after
a given other one. The figures pool every round: all time-to-first-token samples, total turns over
total seconds, total CPU over total turns; the JSON keeps each round's completions per second too.

The engine is one ``luftpause fake-engine`` with no prefill or decode time, ``--max-tokens`` tokens
per reply and more slots than streams, so it never queues. All arrangements run side by side for
the whole run; the ones not being measured are idle apart from their health checks.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.procs import free_port, http_ok

REPO = Path(__file__).resolve().parents[1]
NGINX = "/usr/sbin/nginx"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STREAMED = "stream"
WHOLE = "whole"

# Targets from DESIGN.md "Performance budgets".
TARGET_ADDED_TTFT_S = 0.001
TARGET_CPS_VS_NGINX = 0.8
TARGET_CPU_VS_NGINX = 2.0


class TurnFailed(Exception):
    """A turn that did not end as a complete 200 answer with content; the message says how."""


@dataclass(frozen=True)
class Source:
    """Where the luftpause processes import luftpause from: ``root`` (their working directory, which
    ``python -m`` puts first on ``sys.path``) and the environment that goes with it; ``commit`` is
    what ``root`` holds, or None for the working tree as it is (maybe with uncommitted changes)."""

    root: Path
    env: dict[str, str]
    commit: str | None


def working_tree() -> Source:
    """The checkout this script is in, as installed in the virtualenv."""
    return Source(REPO, dict(os.environ), None)


def export_commit(rev: str, into: Path) -> Source:
    """``git archive`` of ``rev`` into ``into`` with its Cython extensions built in place, so that
    what is measured is exactly that commit whatever others are editing in the working tree.
    ``RuntimeError`` when git or the build fails."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    if not commit:
        raise RuntimeError(f"not a commit: {rev}")
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=into, capture_output=True, text=True
    )
    if build.returncode != 0:
        raise RuntimeError(f"building the extensions of {commit} failed:\n{build.stderr[-2000:]}")
    # The editable install's finder comes after sys.path, so PYTHONPATH wins for every child.
    return Source(into, {**os.environ, "PYTHONPATH": str(into)}, commit)


class Child:
    """One command run in its own session (so its whole process group can be found and ended),
    from ``source``, its output sent to ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, source: Source) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.source = source
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.source.root,
                env=self.source.env,
            )
        return self

    @property
    def pgid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def log_tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout`` seconds."""
        if self.proc is None or not group_pids(self.pgid):
            if self.proc is not None:
                self.proc.wait()
            return
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.proc.poll()
                if not group_pids(self.pgid):
                    break
                time.sleep(0.02)
            else:
                continue
            break
        self.proc.wait()


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ... (proc(5)); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(children: Sequence[Child]) -> float:
    """CPU seconds (user + system) used so far by every live process of ``children``' groups."""
    total = 0
    for child in children:
        for pid in group_pids(child.pgid):
            fields = _stat_fields(pid)
            if fields is not None:
                total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLOCK_TICKS


def memory_of(children: Sequence[Child]) -> list[dict[str, Any]]:
    """Per process of ``children``' groups: pid, command line, ``VmHWM`` and ``VmRSS`` in bytes."""
    rows = []
    for child in children:
        for pid in group_pids(child.pgid):
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
class Arrangement:
    """A way of reaching the engine: ``url`` (base, without ``/v1``) and the proxy's processes, or
    ``reason`` it is not measured."""

    name: str
    url: str | None = None
    children: list[Child] = field(default_factory=list)
    reason: str | None = None


def _nginx_config(tmp: Path, port: int, engine_port: int) -> str:
    temp = "\n".join(
        f"    {kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""
daemon off;
master_process on;
worker_processes 1;
pid {tmp / "nginx.pid"};
error_log {tmp / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp}
    upstream engine {{
        server 127.0.0.1:{engine_port};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 120s;
        }}
    }}
}}
"""


def _luftpause_config(engine_port: int, grpc_port: int, status_port: int, dp_port: int) -> str:
    # max_inflight far above any --streams: the scheduler must not hold turns the engine could run.
    return f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"

[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"

[[replicas]]
name = "sim"
url = "http://127.0.0.1:{engine_port}"
models = ["{DEFAULT_MODEL}"]
max_inflight = 100000
"""


def _wait_answering(url: str, children: Sequence[Child], timeout: float = 60.0) -> None:
    """Wait until a non-streamed turn through ``url`` answers 200; ``RuntimeError`` with the logs
    if a child exits first or ``timeout`` seconds pass."""
    body = orjson.dumps(
        {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for child in children:
            if child.exited():
                code = child.proc.returncode if child.proc else None
                raise RuntimeError(f"{child.name} exited with {code}:\n{child.log_tail()}")
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200 and orjson.loads(response.read())["choices"]:
                    return
        except (OSError, ValueError, KeyError) as exc:
            last = str(exc)
        time.sleep(0.2)
    logs = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in children)
    raise RuntimeError(f"no answer through {url} after {timeout:.0f} s ({last}):\n{logs}")


def start_engine(tmp: Path, src: Source, slots: int, max_tokens: int) -> tuple[Child, int]:
    port = free_port()
    argv = [
        sys.executable, "-m", "luftpause", "fake-engine", "--port", str(port), "--model", DEFAULT_MODEL,
        "--slots", str(slots), "--decode-ms", "0", "--prefill-ms-per-1k", "0",
        "--max-tokens", str(max_tokens), "--tool-rounds", "0",
    ]  # fmt: skip
    engine = Child("engine", argv, tmp / "engine.log", src).start()
    deadline = time.monotonic() + 30
    while not http_ok(f"http://127.0.0.1:{port}/health"):
        if engine.exited() or time.monotonic() > deadline:
            raise RuntimeError(f"the engine did not start:\n{engine.log_tail()}")
        time.sleep(0.05)
    return engine, port


def start_nginx(tmp: Path, src: Source, engine_port: int) -> Arrangement:
    if not os.access(NGINX, os.X_OK):
        return Arrangement("nginx", reason=f"{NGINX} is not installed (apt-get install nginx)")
    work = tmp / "nginx"
    work.mkdir()
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(_nginx_config(work, port, engine_port))
    argv = [NGINX, "-p", str(work), "-e", str(work / "error.log"), "-c", str(conf)]
    return _started("nginx", f"http://127.0.0.1:{port}", [Child("nginx", argv, work / "stdout.log", src)])


def start_luftpause(tmp: Path, src: Source, engine_port: int) -> Arrangement:
    grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
    conf = tmp / "luftpause.toml"
    conf.write_text(_luftpause_config(engine_port, grpc_port, status_port, dp_port))
    luftpause = [sys.executable, "-m", "luftpause"]
    scheduler = Child(
        "scheduler", [*luftpause, "scheduler", "--config", str(conf)], tmp / "scheduler.log", src
    )
    dataplane = Child(
        "dataplane", [*luftpause, "dataplane", "--config", str(conf)], tmp / "dataplane.log", src
    )
    scheduler.start()
    deadline = time.monotonic() + 30
    while not http_ok(f"http://127.0.0.1:{status_port}/health"):
        if scheduler.exited() or time.monotonic() > deadline:
            scheduler.stop()
            return Arrangement("luftpause", reason=f"the scheduler did not start:\n{scheduler.log_tail()}")
        time.sleep(0.05)
    return _started("luftpause", f"http://127.0.0.1:{dp_port}", [scheduler, dataplane.start()], started=1)


def start_sglang_router(tmp: Path, src: Source, engine_port: int) -> Arrangement:
    if importlib.util.find_spec("sglang_router") is None:
        return Arrangement("sglang-router", reason="the sglang_router package is not installed")
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", f"http://127.0.0.1:{engine_port}", "--policy", "round_robin",
        "--prometheus-port", str(free_port()), "--log-level", "warn",
    ]  # fmt: skip
    return _started(
        "sglang-router", f"http://127.0.0.1:{port}", [Child("router", argv, tmp / "router.log", src)]
    )


def _started(name: str, url: str, children: list[Child], started: int = 0) -> Arrangement:
    """Start ``children[started:]`` and wait until a turn goes through ``url``; on failure stop them
    all and return the arrangement with the reason."""
    try:
        for child in children[started:]:
            child.start()
        _wait_answering(url, children)
    except (RuntimeError, OSError) as exc:
        for child in reversed(children):
            child.stop()
        return Arrangement(name, reason=f"did not start: {exc}")
    return Arrangement(name, url, children)


# --- load generator -------------------------------------------------------------------------------


def _first_content_at(buffer: bytes, start: int) -> tuple[bool, int]:
    """Whether a complete SSE event in ``buffer[start:]`` has a delta with non-empty content, and
    the offset after the last complete event looked at (the engines end events with a blank line)."""
    while True:
        end = buffer.find(b"\n\n", start)
        if end < 0:
            return False, start
        for line in buffer[start:end].split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                for choice in orjson.loads(line[5:]).get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        return True, end + 2
        start = end + 2


async def one_turn(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], stream: bool
) -> float:
    """Send one turn and read it to the end; its time to first token in seconds. ``TurnFailed`` when
    the answer is not 200, has no content, or (streamed) does not end with ``data: [DONE]``."""
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            raise TurnFailed(f"status {response.status}: {(await response.read())[:200]!r}")
        if not stream:
            payload = await response.read()
            first = time.perf_counter() - started
            if not orjson.loads(payload)["choices"][0]["message"]["content"]:
                raise TurnFailed(f"no content: {payload[:200]!r}")
            return first
        ttft: float | None = None
        buffer, scanned, tail = b"", 0, b""
        async for data in response.content.iter_any():
            if ttft is None:
                buffer += data
                found, scanned = _first_content_at(buffer, scanned)
                if found:
                    ttft = time.perf_counter() - started
                    buffer = b""
            tail = (tail + data)[-64:]
        if ttft is None:
            raise TurnFailed("the stream carried no content")
        if not tail.rstrip().endswith(b"data: [DONE]"):
            raise TurnFailed(f"the stream did not end with [DONE]: {tail!r}")
        return ttft


@dataclass
class LoadResult:
    """One closed-loop run: ``ttfts`` (seconds, one per completed turn), ``errors`` (their texts),
    ``seconds`` of wall time."""

    ttfts: list[float]
    errors: list[str]
    seconds: float


async def closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    streams: int,
    turns: int,
    stream: bool,
    max_tokens: int,
    tag: str,
) -> LoadResult:
    """``turns`` turns over ``streams`` concurrent streams, each sending its next turn when its last
    one ended; each stream is one run (``x-luftpause-run-id: <tag>-<i>``, sent to every arrangement)."""
    body = orjson.dumps(
        {
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "Say something short."}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )
    endpoint = f"{url}/v1/chat/completions"
    remaining = turns
    ttfts: list[float] = []
    errors: list[str] = []

    async def one_stream(index: int) -> None:
        nonlocal remaining
        headers = {"content-type": "application/json", "x-luftpause-run-id": f"{tag}-{index}"}
        while remaining > 0:
            remaining -= 1
            try:
                ttfts.append(await one_turn(session, endpoint, body, headers, stream))
            except (TurnFailed, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    await asyncio.gather(*(one_stream(i) for i in range(streams)))
    return LoadResult(ttfts, errors, time.perf_counter() - started)


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
    engine: Child,
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


def _cpu_by_child(children: Sequence[Child]) -> dict[str, float]:
    """CPU seconds so far per child name (each child's whole process group)."""
    return {child.name: cpu_seconds([child]) for child in children}


async def run_all(
    arrangements: list[Arrangement], engine: Child, args: argparse.Namespace
) -> dict[tuple[int, str, str], Measurement]:
    """Every measured arrangement at every concurrency and mode, ``args.rounds`` times, the order of
    arrangements rotated by one place per round and per cell."""
    measured = [a for a in arrangements if a.url is not None]
    cells = [(streams, mode) for streams in args.streams for mode in (STREAMED, WHOLE)]
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


# --- report ---------------------------------------------------------------------------------------


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
        nginx = results.get((count, mode, "nginx"))
        p50 = percentile(m.ttfts, 0.5)
        cpu = m.per_1k(m.proxy_cpu_s) if name != "direct" else math.nan
        rows.append(
            {
                "arrangement": name,
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
    order = {n: i for i, n in enumerate(("direct", "nginx", "luftpause", "sglang-router"))}
    rows.sort(
        key=lambda r: (
            streams.index(r["streams"]),
            r["mode"] != STREAMED,
            order.get(str(r["arrangement"]), 9),
        )
    )
    return rows


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


def targets(rows: list[dict[str, Any]], streams: Sequence[int]) -> list[dict[str, Any]]:
    """The DESIGN.md budgets for luftpause on streamed turns, each ``met`` True/False, or None when
    its concurrency or baseline was not measured."""
    by = {(r["streams"], r["mode"], r["arrangement"]): r for r in rows}
    checks: list[dict[str, Any]] = []

    def check(what: str, count: int, key: str, limit: float, below: bool) -> None:
        row = by.get((count, STREAMED, "luftpause"))
        value = row[key] if row else math.nan
        met = None if math.isnan(value) else (value < limit if below else value >= limit)
        checks.append({"target": what, "streams": count, "value": value, "limit": limit, "met": met})

    check("added TTFT p50 (s) < 0.001", 1, "added_ttft_p50_s", TARGET_ADDED_TTFT_S, below=True)
    for count in (16, 64):
        check("completions/s vs nginx >= 0.8", count, "cps_vs_nginx", TARGET_CPS_VS_NGINX, below=False)
    for count in streams:
        check("CPU per turn vs nginx <= 2", count, "cpu_vs_nginx", TARGET_CPU_VS_NGINX + 1e-12, below=True)
    return checks


def _git(*argv: str) -> str:
    """``git <argv>``'s output in this checkout, stripped; empty when git fails."""
    done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def describe_source(src: Source) -> dict[str, Any]:
    """What was measured: the commit, and for the working tree the files of ``luftpause/`` and
    ``_speedups/`` that differ from it."""
    if src.commit is not None:
        return {"commit": src.commit, "source": "exported commit", "uncommitted": []}
    changed = _git("status", "--porcelain", "--", "luftpause", "_speedups").splitlines()
    return {"commit": _git("rev-parse", "HEAD"), "source": "working tree", "uncommitted": changed}


def sse_extension_loaded(src: Source) -> bool:
    """Whether the dataplane started from ``src`` takes the compiled SSE scanner."""
    probe = "from luftpause.dataplane.sse import USING_EXTENSION as u; print(u)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=src.root, env=src.env, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() == "True"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--streams", default="1,16,64", help="concurrent streams, comma-separated (default: %(default)s)"
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=1000,
        help="measured turns per arrangement, cell and round (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=100,
        help="unmeasured turns before each measurement (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="repetitions, arrangement order rotated (default: %(default)s)"
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
    parser.add_argument(
        "--at",
        default=None,
        metavar="REV",
        help="measure this commit (exported and built apart) instead of the working tree",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the processes' logs and configs in this directory"
    )
    args = parser.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",") if s.strip()]
    if not args.streams or min(args.streams) < 1 or args.turns < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--streams, --turns and --rounds must be positive, --warmup not negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every measured turn succeeded, 1 otherwise."""
    args = parse_args(argv)
    # A SIGTERM (a test's timeout, a Ctrl-C'd parent) must still stop the children: raise through finally.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="luftpause-e2e-"))
    tmp.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    engine: Child | None = None
    arrangements: list[Arrangement] = []
    try:
        src = working_tree() if args.at is None else export_commit(args.at, tmp / "src")
        sse_extension = sse_extension_loaded(src)
        engine, engine_port = start_engine(tmp, src, slots=max(args.streams) * 4, max_tokens=args.max_tokens)
        arrangements = [Arrangement("direct", f"http://127.0.0.1:{engine_port}")]
        for start in (start_nginx, start_luftpause, start_sglang_router):
            arrangements.append(start(tmp, src, engine_port))
        luftpause = next(a for a in arrangements if a.name == "luftpause")
        if luftpause.url is None:
            print(f"luftpause: {luftpause.reason}", file=sys.stderr)
            return 1
        results = uvloop.run(run_all(arrangements, engine, args))
        memory = memory_of([c for c in luftpause.children if c.name == "dataplane"])
        scheduler_memory = memory_of([c for c in luftpause.children if c.name == "scheduler"])
    finally:
        for arrangement in reversed(arrangements):
            for child in reversed(arrangement.children):
                child.stop()
        if engine is not None:
            engine.stop()
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)

    rows = summarise(results, args.streams)
    checks = targets(rows, args.streams)
    report = {
        **describe_source(src),
        "started": started.isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0]},
        "settings": {
            "streams": args.streams,
            "turns": args.turns,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "sse_extension": sse_extension,
        },
        "arrangements": {a.name: {"measured": a.url is not None, "reason": a.reason} for a in arrangements},
        "rows": rows,
        "targets": checks,
        "dataplane_memory": memory,
        "scheduler_memory": scheduler_memory,
    }
    print(table(rows))
    print()
    for a in arrangements:
        if a.url is None:
            print(f"{a.name}: not measured: {(a.reason or '').splitlines()[0]}")
    for c in checks:
        state = {True: "met", False: "MISSED", None: "not measured"}[c["met"]]
        print(f"target {c['target']} at {c['streams']} stream(s): {_fmt(c['value'], digits=4)} -> {state}")
    for m in memory:
        print(
            f"dataplane pid {m['pid']}: peak RSS {m['peak_rss_bytes'] / 2**20:.1f} MiB over the run "
            f"(largest concurrency {max(args.streams)} streams), "
            f"RSS at the end {m['rss_bytes'] / 2**20:.1f} MiB"
        )
    dirty = (
        f", with uncommitted changes in {len(report['uncommitted'])} files" if report["uncommitted"] else ""
    )
    print(
        f"{report['source']} at {report['commit']}{dirty}; load average (1 min) "
        f"{load_before[0]:.2f} before, {report['load_average_1m']['after']:.2f} after"
    )
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0 if all(r["errors"] == 0 and r["turns"] > 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
