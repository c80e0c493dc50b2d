"""One engine killed under ``luftpause up`` under load: how many turns fail (SIMULATED engines).

The issue (25) measured it on the code of the day: 1,367 of 1,831 turns failed, because ``up``
stopped the whole stack when one engine died. This runs the same experiment on two source trees in
one session, the baseline (``--baseline-tree``, e.g. the main checkout) and this one, so both are
measured on the same (shared) machine:

* ``luftpause up --config FILE --simulate`` (two simulated engines, the fake MCP server, scheduler,
  dataplane, runtime), the tree's code taken first on ``PYTHONPATH`` (and the pure-Python twins,
  ``LUFTPAUSE_NO_EXTENSIONS=1``, as a tree may not have its Cython modules built);
* ``--threads`` threads of the ``openai`` client send turns for ``--duration-s`` seconds, streamed
  and whole in turn (16 tokens each, their own run each);
* at ``--kill-at-s`` the engine of replica ``sim-0`` is SIGKILLed (its process group).

Counted per run: turns answered, turns that failed (an error status, a connection refused, a
stream broken), before and after the kill, and whether ``up`` was still running at the end.

    .venv/bin/python bench/failover_under_up.py --baseline-tree /work/main [--threads 8]
                                                [--duration-s 40] [--kill-at-s 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import openai
import orjson

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import free_port, stat_fields

HI = [{"role": "user", "content": "hi"}]


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def engine_of(up: int, port: int) -> int | None:
    """The pid of up's child serving the simulated engine on ``port``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(int(entry))) is not None and int(fields[1]) == up:
            try:
                words = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().split()
            except OSError:
                continue
            if "fake-engine" in words and str(port) in words:
                return int(entry)
    return None


def load(base: str, stop: threading.Event, killed: threading.Event, counts: Counter[str]) -> None:
    with openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=30) as client:
        streamed = False
        while not stop.is_set():
            streamed = not streamed
            phase = "after" if killed.is_set() else "before"
            try:
                if streamed:
                    for _ in client.chat.completions.create(
                        model=DEFAULT_MODEL,
                        messages=HI,
                        max_tokens=16,
                        stream=True,  # type: ignore[arg-type]
                    ):
                        pass
                else:
                    client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, max_tokens=16)  # type: ignore[arg-type]
                counts[f"{phase} ok"] += 1
            except openai.APIError as exc:
                counts[f"{phase} failed"] += 1
                kind = f"{phase} failed: {getattr(exc, 'status_code', None) or type(exc).__name__}"
                counts[kind] += 1
                time.sleep(0.05)  # a stack that is down is not hammered


def measure(tree: Path, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    ports = {name: free_port() for name in ("e0", "e1", "mcp", "grpc", "http", "dp", "rt")}
    config = workdir / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{ports["grpc"]}"\nhttp = "127.0.0.1:{ports["http"]}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{ports["dp"]}"\nscheduler = "127.0.0.1:{ports["grpc"]}"\n'
        f'[runtime]\nlisten = "127.0.0.1:{ports["rt"]}"\ndataplane = "http://127.0.0.1:{ports["dp"]}"\n'
        f'state_dir = "{workdir / "state"}"\n'
        + "".join(
            f'[[replicas]]\nname = "sim-{i}"\nurl = "http://127.0.0.1:{ports[f"e{i}"]}"\n'
            f'models = ["{DEFAULT_MODEL}"]\n'
            for i in range(2)
        )
        + f'[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:{ports["mcp"]}/mcp"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "LUFTPAUSE_NO_EXTENSIONS": "1", "LUFTPAUSE_TOKEN": ""}
    log = open(workdir / "up.log", "wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "luftpause", "up", "--config", str(config), "--simulate",
         "--logs", str(workdir)],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree, start_new_session=True,
    )  # fmt: skip
    counts: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + 180
        while not ready(f"http://127.0.0.1:{ports['dp']}/readyz"):
            if time.monotonic() > deadline or up.poll() is not None:
                raise RuntimeError(f"the stack did not start: {(workdir / 'up.log').read_text()[-2000:]}")
            time.sleep(0.5)
        stop, killed = threading.Event(), threading.Event()
        base = f"http://127.0.0.1:{ports['dp']}/v1"
        with ThreadPoolExecutor(args.threads) as pool:
            workers = [pool.submit(load, base, stop, killed, counts) for _ in range(args.threads)]
            time.sleep(args.kill_at_s)
            victim = engine_of(up.pid, ports["e0"])
            if victim is None:
                raise RuntimeError("no engine sim-0 under up")
            killed.set()
            os.killpg(victim, signal.SIGKILL)
            time.sleep(args.duration_s - args.kill_at_s)
            stop.set()
            for worker in workers:
                worker.result()
        return {"tree": str(tree), "up_still_running": up.poll() is None, **dict(sorted(counts.items()))}
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", type=Path, required=True, help="the source tree to compare with")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--kill-at-s", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    this_tree = Path(__file__).resolve().parent.parent
    results: dict[str, Any] = {"engine": "SIMULATED", "load_average": os.getloadavg()}
    with TemporaryDirectory(prefix="failover-up-") as tmp:
        for name, tree in (("baseline", args.baseline_tree.resolve()), ("this", this_tree)):
            workdir = Path(tmp) / name
            workdir.mkdir()
            results[name] = measure(tree, args, workdir)
            r = results[name]
            print(
                f"{name} ({tree}): before the kill {r.get('before ok', 0)} ok, "
                f"{r.get('before failed', 0)} failed; "
                f"after it {r.get('after ok', 0)} ok, {r.get('after failed', 0)} failed; "
                f"up still running: {r['up_still_running']}",
                flush=True,
            )
    results["load_average_after"] = os.getloadavg()
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
