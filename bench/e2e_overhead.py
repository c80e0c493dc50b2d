"""End-to-end overhead of the dataplane: the same fast simulated engine reached directly, through
nginx, through luftpause (dataplane + scheduler) and through SGLang's router, in one run.

Usage::

    .venv/bin/python bench/e2e_overhead.py [--streams 1,16,64] [--turns N] [--rounds R] [--json out.json]
        [--workers 1,2] [--modes stream,whole]

What is measured (docs/architecture.md "Performance budgets"): for every number of concurrent streams and
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
  is installed (it is not a dependency of luftpause);
* ``smg``: SGLang Model Gateway (``python -m smg launch``, round robin) when the ``smg`` package is
  installed (not a dependency either);
* with ``--workers 1,2,...``: for each N above 1 also ``nginx-w<N>`` (``worker_processes N``) and
  ``luftpause-w<N>`` (``[dataplane] workers = N``), each compared with the nginx of as many
  workers; the report adds each arrangement's completions/s per worker and a projection for a
  16-core host from its CPU per turn (a projection, not a measurement: see ``e2e_report``).

An arrangement that cannot start is reported as ``not measured: <why>``, never silently left out.

Drift on a shared machine: every measurement (one arrangement, one concurrency, one mode) is
repeated ``--rounds`` times; in each round the arrangements run one after the other, their order
rotated by one place per round and per cell, so that no arrangement is always first or last after
a given other one. The figures pool every round: all time-to-first-token samples, total turns over
total seconds, total CPU over total turns; the JSON keeps each round's completions per second too.

The engine is one ``luftpause fake-engine`` with no prefill or decode time, ``--max-tokens`` tokens
per reply and more slots than streams, so it never queues. All arrangements run side by side for
the whole run; the ones not being measured are idle apart from their health checks.

The script is split by part: ``e2e_arrangements.py`` (the source, the engine and the ways of
reaching it, as processes), ``e2e_load.py`` (closed-loop turns), ``e2e_measure.py`` (CPU, memory
and pooling over rounds) and ``e2e_report.py`` (rows, table, targets).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson
import uvloop
from e2e_arrangements import (
    Arrangement,
    export_commit,
    start_engine,
    start_luftpause,
    start_nginx,
    start_sglang_router,
    start_smg,
    working_tree,
)
from e2e_measure import STREAMED, WHOLE, memory_of, run_all
from e2e_report import (
    _fmt,
    describe_source,
    projection_table,
    projections,
    sse_extension_loaded,
    summarise,
    table,
    targets,
)

from luftpause.testkit.launch.procs import ChildProcess


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
    parser.add_argument(
        "--workers",
        default="1",
        help="worker processes of nginx and of the dataplane, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--modes", default=f"{STREAMED},{WHOLE}", help="turn modes measured (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",") if s.strip()]
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.workers or min(args.workers) < 1:
        parser.error("--workers must be positive")
    if not args.modes or set(args.modes) - {STREAMED, WHOLE}:
        parser.error(f"--modes takes {STREAMED} and {WHOLE}")
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
    engine: ChildProcess | None = None
    arrangements: list[Arrangement] = []
    try:
        src = working_tree() if args.at is None else export_commit(args.at, tmp / "src")
        sse_extension = sse_extension_loaded(src)
        engine, engine_port = start_engine(tmp, src, slots=max(args.streams) * 4, max_tokens=args.max_tokens)
        arrangements = [Arrangement("direct", f"http://127.0.0.1:{engine_port}")]
        for workers in args.workers:
            arrangements.append(start_nginx(tmp, src, engine_port, workers))
            arrangements.append(start_luftpause(tmp, src, engine_port, workers))
        for start in (start_sglang_router, start_smg):
            arrangements.append(start(tmp, src, engine_port))
        ours = [a for a in arrangements if a.name.startswith("luftpause")]
        for a in ours:
            if a.url is None:
                print(f"{a.name}: {a.reason}", file=sys.stderr)
                return 1
        luftpause = ours[0]
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
    checks = targets(rows, args.streams, luftpause.name)
    projected = projections(rows)
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
            "workers": args.workers,
            "modes": args.modes,
        },
        "arrangements": {a.name: {"measured": a.url is not None, "reason": a.reason} for a in arrangements},
        "rows": rows,
        "targets": checks,
        "projection_16_cores": projected,
        "dataplane_memory": memory,
        "scheduler_memory": scheduler_memory,
    }
    print(table(rows))
    print()
    if len(args.workers) > 1 or any(a.name == "smg" and a.url for a in arrangements):
        print(projection_table(projected))
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
