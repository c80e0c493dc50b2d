"""The arrangements of the end-to-end overhead benchmark (``e2e_overhead.py``): where the code
under test comes from (:class:`Source`), the fast simulated engine, and each way of reaching it
(direct, nginx, luftpause, SGLang's router, SGLang Model Gateway) as :class:`Arrangement` with its
processes. nginx and luftpause may run several workers (``worker_processes``, ``[dataplane]
workers``): their arrangement is then named ``nginx-w<N>`` and ``luftpause-w<N>``.

Every process is a :class:`luftpause.testkit.launch.procs.ChildProcess` in its own session, so that its
whole process group is measured and stopped. An arrangement that cannot start is returned with the
reason, its processes already stopped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import ChildProcess, free_port

REPO = Path(__file__).resolve().parents[1]
NGINX = "/usr/sbin/nginx"


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
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
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


def _child(
    name: str, argv: Sequence[str], log: Path, src: Source, ready_url: str | None = None
) -> ChildProcess:
    """A whole command line ``argv`` run from ``src`` (its root as working directory, its
    environment only), output to ``log``."""
    return ChildProcess(
        name, argv, log, env=src.env, ready_url=ready_url, program=(), cwd=src.root, replace_env=True
    )


@dataclass
class Arrangement:
    """A way of reaching the engine: ``url`` (base, without ``/v1``) and the proxy's processes, or
    ``reason`` it is not measured."""

    name: str
    url: str | None = None
    children: list[ChildProcess] = field(default_factory=list)
    reason: str | None = None


def workers_name(name: str, workers: int) -> str:
    """``name`` for one worker, ``name-w<workers>`` for more."""
    return name if workers == 1 else f"{name}-w{workers}"


def _nginx_config(tmp: Path, port: int, engine_port: int, workers: int = 1) -> str:
    temp = "\n".join(
        f"    {kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""
daemon off;
master_process on;
worker_processes {workers};
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


def _luftpause_config(
    engine_port: int, grpc_port: int, status_port: int, dp_port: int, workers: int = 1
) -> str:
    # max_inflight far above any --streams: the scheduler must not hold turns the engine could run.
    return f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"

[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"
{f"workers = {workers}" if workers > 1 else ""}

[[replicas]]
name = "sim"
url = "http://127.0.0.1:{engine_port}"
models = ["{DEFAULT_MODEL}"]
max_inflight = 100000
"""


def wait_answering(url: str, children: Sequence[ChildProcess], timeout: float = 60.0) -> None:
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


def start_engine(tmp: Path, src: Source, slots: int, max_tokens: int) -> tuple[ChildProcess, int]:
    """The fast simulated engine (no prefill or decode time, ``max_tokens`` per reply, ``slots``
    running places) and its port; ``RuntimeError`` with its log when it does not start."""
    port = free_port()
    argv = [
        sys.executable, "-m", "luftpause", "fake-engine", "--port", str(port), "--model", DEFAULT_MODEL,
        "--slots", str(slots), "--decode-ms", "0", "--prefill-ms-per-1k", "0",
        "--max-tokens", str(max_tokens), "--tool-rounds", "0",
    ]  # fmt: skip
    engine = _child("engine", argv, tmp / "engine.log", src, f"http://127.0.0.1:{port}/health").start()
    try:
        engine.wait_ready(timeout=30)
    except BaseException:
        engine.stop()
        raise
    return engine, port


def start_nginx(tmp: Path, src: Source, engine_port: int, workers: int = 1) -> Arrangement:
    """nginx with ``workers`` worker processes."""
    name = workers_name("nginx", workers)
    if not os.access(NGINX, os.X_OK):
        return Arrangement(name, reason=f"{NGINX} is not installed (apt-get install nginx)")
    work = tmp / name
    work.mkdir()
    port = free_port()
    conf = work / "nginx.conf"
    conf.write_text(_nginx_config(work, port, engine_port, workers))
    argv = [NGINX, "-p", str(work), "-e", str(work / "error.log"), "-c", str(conf)]
    return _started(name, f"http://127.0.0.1:{port}", [_child("nginx", argv, work / "stdout.log", src)])


def start_luftpause(tmp: Path, src: Source, engine_port: int, workers: int = 1) -> Arrangement:
    """The scheduler (started and waited for first: the dataplane resyncs with it), then the
    dataplane with ``workers`` workers; each started exactly once."""
    name = workers_name("luftpause", workers)
    grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
    tmp = tmp / name
    tmp.mkdir()
    conf = tmp / "luftpause.toml"
    conf.write_text(_luftpause_config(engine_port, grpc_port, status_port, dp_port, workers))
    luftpause = [sys.executable, "-m", "luftpause"]
    scheduler = _child(
        "scheduler",
        [*luftpause, "scheduler", "--config", str(conf)],
        tmp / "scheduler.log",
        src,
        f"http://127.0.0.1:{status_port}/health",
    )
    dataplane = _child(
        "dataplane", [*luftpause, "dataplane", "--config", str(conf)], tmp / "dataplane.log", src
    )
    return _started(name, f"http://127.0.0.1:{dp_port}", [scheduler, dataplane])


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
        "sglang-router", f"http://127.0.0.1:{port}", [_child("router", argv, tmp / "router.log", src)]
    )


def start_smg(tmp: Path, src: Source, engine_port: int) -> Arrangement:
    """SGLang Model Gateway (PyPI ``smg``, not a dependency of luftpause) in front of the engine,
    round robin over its one worker: a Rust gateway, threads on every core."""
    if importlib.util.find_spec("smg") is None:
        return Arrangement("smg", reason="the smg package is not installed (pip install smg)")
    port = free_port()
    argv = [
        sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", f"http://127.0.0.1:{engine_port}", "--policy", "round_robin",
        "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1", "--log-level", "warn",
    ]  # fmt: skip
    return _started("smg", f"http://127.0.0.1:{port}", [_child("smg", argv, tmp / "smg.log", src)])


def _started(name: str, url: str, children: list[ChildProcess]) -> Arrangement:
    """Start ``children`` in order, each once (waiting for those with a ``ready_url`` before the
    next), then wait until a turn goes through ``url``; on failure stop them all and return the
    arrangement with the reason."""
    try:
        for child in children:
            child.start()
            if child.ready_url is not None:
                child.wait_ready(timeout=30)
        wait_answering(url, children)
    except (RuntimeError, OSError) as exc:
        for child in reversed(children):
            child.stop()
        return Arrangement(name, reason=f"did not start: {exc}")
    return Arrangement(name, url, children)


def git(*argv: str) -> str:
    """``git <argv>``'s output in this checkout, stripped; empty when git fails."""
    done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""
