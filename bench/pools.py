"""Two fresh engine replicas and one arrangement in front of them, as real processes; shared by
``flood.py`` and ``fanout.py``.

Engines: the simulator (``luftpause fake-engine``, the default) or, with ``llama=LlamaEngines(...)``,
real llama.cpp ``llama-server`` replicas on CPU serving SmolLM2-135M
(:mod:`luftpause.testkit.llama_server`; built once by ``bench/engines/llama_server.sh``).

Arrangements: ``router`` (SGLang's router, ``--policy cache_aware``, its Prometheus exporter on a
free port rather than its fixed default :29000), ``luftpause`` (scheduler + dataplane),
``luftpause-no-affinity`` (the same with ``[scheduler] strict_affinity = false``) and ``direct``
(nothing in front: ``url`` is empty and ``spread`` lists the engines, one agent to each in turn, as
a client-side list of servers would). Every process is a
:class:`luftpause.testkit.procs.ChildProcess` in its own session, stopped with its whole process
group when the pool closes.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit import llama_server
from luftpause.testkit.procs import ChildProcess, free_port

ARRANGEMENTS = ("router", "luftpause", "luftpause-no-affinity")
DIRECT = "direct"
"""The engines with nothing in front; measured when asked for (flood.py's default for llama-server)."""


@dataclass(frozen=True)
class LlamaEngines:
    """``replicas`` llama-server replicas, each run with ``options`` (slots, threads, context)."""

    replicas: int = 2
    options: llama_server.ReplicaOptions = field(default_factory=llama_server.ReplicaOptions)


def unavailable(arrangement: str) -> str | None:
    """Why ``arrangement`` cannot be measured here, or ``None``."""
    if arrangement == "router" and importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install sglang-router)"
    if arrangement not in (*ARRANGEMENTS, DIRECT):
        return f"unknown arrangement {arrangement!r}"
    return None


class Pool:
    """Two fresh simulated engines (``fake-engine`` with ``engine_args``), or ``llama``'s
    llama-server replicas, and, in front of them, ``arrangement``; ``url`` is its base URL (no
    ``/v1``; empty for ``direct``, whose agents go to ``spread``), ``model`` the model to ask for,
    ``engines`` the engines' URLs. A context manager: leaving it stops every process.
    ``max_inflight`` is each replica's ``max_inflight`` in luftpause's configuration; ``None``
    leaves the configuration's default, so the scheduler admits by the engines' load."""

    def __init__(
        self,
        workdir: Path,
        arrangement: str,
        engine_args: list[str],
        max_inflight: int | None = None,
        llama: LlamaEngines | None = None,
    ) -> None:
        self.workdir = workdir
        self.arrangement = arrangement
        self.engine_args = engine_args
        self.max_inflight = max_inflight
        self.llama = llama
        self.children: list[ChildProcess] = []
        self.url = ""
        self.model = DEFAULT_MODEL if llama is None else llama_server.MODEL_NAME
        self.engines: list[str] = []
        self.spread: tuple[str, ...] = ()

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

    def _start_engines(self) -> list[str]:
        if self.llama is not None:
            installed = llama_server.find()
            if installed is None:
                raise RuntimeError(llama_server.missing())
            ports = [free_port() for _ in range(self.llama.replicas)]
            for i, port in enumerate(ports):
                log = self.workdir / f"engine{i}.log"
                self._child(llama_server.replica(installed, f"engine{i}", port, log, self.llama.options), 120)
            return [f"http://127.0.0.1:{port}" for port in ports]
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
        return [f"http://127.0.0.1:{port}" for port in ports]

    def _start(self) -> None:
        engines = self.engines = self._start_engines()
        if self.arrangement == DIRECT:
            self.spread = tuple(engines)
            return
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
        kind = "sim" if self.llama is None else "llama"
        replicas = "".join(
            f'\n[[replicas]]\nname = "{kind}-{i}"\nurl = "{url}"\nmodels = ["{self.model}"]\n{inflight}'
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
