"""Two fresh simulated engine replicas and one arrangement in front of them, as real processes;
shared by ``flood.py`` and ``fanout.py``.

Arrangements: ``router`` (SGLang's router, ``--policy cache_aware``, its Prometheus exporter on a
free port rather than its fixed default :29000), ``luftpause`` (scheduler + dataplane) and
``luftpause-no-affinity`` (the same with ``[scheduler] strict_affinity = false``). Every process is
a :class:`luftpause.testkit.procs.ChildProcess` in its own session, stopped with its whole process
group when the pool closes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.procs import ChildProcess, free_port

ARRANGEMENTS = ("router", "luftpause", "luftpause-no-affinity")


def unavailable(arrangement: str) -> str | None:
    """Why ``arrangement`` cannot be measured here, or ``None``."""
    if arrangement == "router" and importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install sglang-router)"
    return None


class Pool:
    """Two fresh simulated engines (``fake-engine`` with ``engine_args``) and, in front of them,
    ``arrangement``; ``url`` is its base URL (no ``/v1``). A context manager: leaving it stops every
    process. ``max_inflight`` is each replica's ``max_inflight`` in luftpause's configuration;
    ``None`` leaves the configuration's default, so the scheduler admits by the engines' load."""

    def __init__(
        self, workdir: Path, arrangement: str, engine_args: list[str], max_inflight: int | None = None
    ) -> None:
        self.workdir = workdir
        self.arrangement = arrangement
        self.engine_args = engine_args
        self.max_inflight = max_inflight
        self.children: list[ChildProcess] = []
        self.url = ""

    def __enter__(self) -> Pool:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for child in reversed(self.children):
            child.stop()

    def _child(self, child: ChildProcess, timeout: float = 30.0) -> None:
        self.children.append(child.start())
        child.wait_ready(timeout)

    def _start(self) -> None:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            argv = ["fake-engine", "--port", str(port), "--model", DEFAULT_MODEL, "--seed", str(i)]
            self._child(
                ChildProcess(
                    f"engine{i}",
                    [*argv, *self.engine_args],
                    self.workdir / f"engine{i}.log",
                    ready_url=f"http://127.0.0.1:{port}/health",
                )
            )
        engines = [f"http://127.0.0.1:{port}" for port in ports]
        if self.arrangement == "router":
            port = free_port()
            argv = [
                sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--policy", "cache_aware", "--worker-urls", *engines,
                "--prometheus-port", str(free_port()), "--log-level", "warn",
            ]  # fmt: skip
            router = ChildProcess(
                "router",
                argv,
                self.workdir / "router.log",
                ready_url=f"http://127.0.0.1:{port}/health",
                program=(),
            )
            self._child(router, timeout=60)
            self.url = f"http://127.0.0.1:{port}"
            return
        grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
        affinity = "strict_affinity = false" if self.arrangement == "luftpause-no-affinity" else ""
        inflight = f"max_inflight = {self.max_inflight}\n" if self.max_inflight is not None else ""
        replicas = "".join(
            f'\n[[replicas]]\nname = "sim-{i}"\nurl = "{url}"\nmodels = ["{DEFAULT_MODEL}"]\n{inflight}'
            for i, url in enumerate(engines)
        )
        config = self.workdir / "luftpause.toml"
        config.write_text(
            f'[scheduler]\ngrpc = "127.0.0.1:{grpc_port}"\nhttp = "127.0.0.1:{status_port}"\n{affinity}\n'
            f'[dataplane]\nlisten = "127.0.0.1:{dp_port}"\nscheduler = "127.0.0.1:{grpc_port}"\n{replicas}'
        )
        conf = ["--config", str(config)]
        for name, port in (("scheduler", status_port), ("dataplane", dp_port)):
            self._child(
                ChildProcess(
                    name,
                    [name, *conf],
                    self.workdir / f"{name}.log",
                    ready_url=f"http://127.0.0.1:{port}/health",
                )
            )
        self.url = f"http://127.0.0.1:{dp_port}"
