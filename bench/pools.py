"""Fresh engine replicas (two unless told) and one arrangement in front of them, as real processes;
shared by ``flood.py`` and ``fanout.py``.

Engines: the simulator (``luftpause fake-engine``, the default) or, with ``llama=LlamaEngines(...)``,
real llama.cpp ``llama-server`` replicas on CPU serving SmolLM2-135M
(:mod:`luftpause.testkit.launch.llama_server`; built once by ``bench/engines/llama_server.sh``).

Arrangements: ``router`` (SGLang's router, ``--policy cache_aware``, its Prometheus exporter on a
free port rather than its fixed default :29000, its balance thresholds set by ``router_balance``),
``smg`` (SGLang Model Gateway 1.13 at its best for a flood, see :data:`SMG_YAML`),
``luftpause`` (scheduler + dataplane) and
``luftpause-no-affinity`` (the same with ``[scheduler] strict_affinity = false``: runs may move
between replicas), ``luftpause-idle-off`` (the same with ``[scheduler] idle_affinity = "off"``:
an idle run's next turn goes to the least loaded replica, as before idle affinity); and, when asked
for, ``direct`` (nothing in front: ``url`` is empty and ``spread`` lists the engines, one agent to
each in turn, as a client-side list of servers would).
Every process is
a :class:`luftpause.testkit.launch.procs.ChildProcess` in its own session, stopped with its whole process
group when the pool closes.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch import llama_server
from luftpause.testkit.launch.procs import ChildProcess, free_port

ARRANGEMENTS = ("router", "smg", "luftpause", "luftpause-no-affinity", "luftpause-idle-off", "thunderagent")
DEFAULT_ARRANGEMENTS = ARRANGEMENTS[:4]
"""What flood.py and fanout.py measure unless told: ``luftpause-idle-off`` and ``thunderagent``
only when asked for."""
THUNDERAGENT_ENV = "LUFTPAUSE_BENCH_THUNDERAGENT"
"""The ``thunderagent`` executable to run (default: the one on ``PATH``). ThunderAgent is not on
PyPI: fetch ``HaoKang-Timmy/ThunderAgent`` and ``pip install`` it into a virtual environment of its
own; as published its scheduler never resumes a paused program (the resume loop in
``ThunderAgent/scheduler/router.py`` reads ``step_count`` from ``(id, state, info)`` tuples), so
unpack the tuple there first."""
DIRECT = "direct"
"""The engines with nothing in front; measured when asked for (flood.py's default for llama-server)."""


@dataclass(frozen=True)
class LlamaEngines:
    """``replicas`` llama-server replicas, each run with ``options`` (slots, threads, context)."""

    replicas: int = 2
    options: llama_server.ReplicaOptions = field(default_factory=llama_server.ReplicaOptions)


@dataclass(frozen=True)
class RouterBalance:
    """SGLang's router's balance thresholds (``--balance-abs-threshold``,
    ``--balance-rel-threshold``): it sends a turn to the least loaded worker, whatever its cache,
    when the busiest has more than ``absolute`` turns in flight above the idlest and more than
    ``relative`` times its count. Its defaults (64, 1.5) never trigger on a pool of a few slots."""

    absolute: int
    relative: float


SMG_HEADERS = {"interactive": "interactive", "batch": "bulk"}
"""The ``x-smg-priority`` class each service class's agents send through SGLang Model Gateway."""


def smg_yaml(interactive_agents: int) -> str:
    """The gateway's ``--priority-scheduler-config``: its built-in class defaults
    (``ClassConfig::default_for``, model_gateway/src/middleware/scheduler/config.rs) except the
    reservation floors, sized for a pool of a few engine slots (the built-in system floor of 32 and
    interactive floor of 128 exceed it, and the gateway then refuses its scheduler and falls back to
    its legacy limiter): system none, interactive one slot per interactive agent (with the built-in
    share of 0.25 of capacity, whichever is more)."""
    return f"""classes:
  system: {{reserved_floor: 0, reserved_per_slot: 0.0, queue_size: 64, queue_timeout_secs: 30,
           starvation_threshold_secs: 5, can_preempt: true}}
  interactive: {{reserved_floor: {interactive_agents}, reserved_per_slot: 0.25, queue_size: 256,
                queue_timeout_secs: 30, starvation_threshold_secs: 5, can_preempt: true}}
  default: {{reserved_floor: 0, reserved_per_slot: 0.10, queue_size: 512, queue_timeout_secs: 60,
            starvation_threshold_secs: 30, can_preempt: false}}
  bulk: {{reserved_floor: 0, reserved_per_slot: 0.0, queue_size: 1024, queue_timeout_secs: 300,
         starvation_threshold_secs: 120, can_preempt: false}}
"""


def unavailable(arrangement: str) -> str | None:
    """Why ``arrangement`` cannot be measured here, or ``None``."""
    if arrangement == "router" and importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install sglang-router==0.3.2)"
    if arrangement == "smg" and importlib.util.find_spec("smg") is None:
        return "SGLang Model Gateway is not installed (pip install smg)"
    if arrangement == "thunderagent" and _thunderagent() is None:
        return f"ThunderAgent is not installed (no thunderagent on PATH; or set {THUNDERAGENT_ENV})"
    if arrangement not in (*ARRANGEMENTS, DIRECT):
        return f"unknown arrangement {arrangement!r}"
    return None


def _thunderagent() -> str | None:
    return shutil.which(os.environ.get(THUNDERAGENT_ENV, "thunderagent"))


class Pool:
    """Fresh simulated engines (``fake-engine`` with ``engine_args``) and, in front of them,
    ``arrangement``; ``url`` is its base URL (no ``/v1``). A context manager: leaving it stops every
    process. ``max_inflight`` is each replica's ``max_inflight`` in luftpause's configuration;
    ``None`` leaves the configuration's default, so the scheduler admits by the engines' load.
    ``runtime`` (luftpause's arrangements only): also the fake MCP server (``luftpause fake-mcp``)
    and the runtime with it as its one upstream, ``runtime_url`` its MCP endpoint, for sub-agents
    spawned over MCP. ``replicas``: how many simulated engines (real ones: ``llama.replicas``);
    ``router_balance``: the router's balance thresholds (``None``: its defaults)."""

    def __init__(
        self,
        workdir: Path,
        arrangement: str,
        engine_args: list[str],
        max_inflight: int | None = None,
        interactive_agents: int = 4,
        llama: LlamaEngines | None = None,
        runtime: bool = False,
        replicas: int = 2,
        router_balance: RouterBalance | None = None,
    ) -> None:
        self.replicas = replicas
        self.router_balance = router_balance
        self.workdir = workdir
        self.runtime = runtime
        self.runtime_url = ""
        self.arrangement = arrangement
        self.interactive_agents = interactive_agents
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
        ports = [free_port() for _ in range(self.replicas)]
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
            if self.router_balance is not None:
                argv += [
                    "--balance-abs-threshold", str(self.router_balance.absolute),
                    "--balance-rel-threshold", str(self.router_balance.relative),
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
        if self.arrangement == "smg":
            self._start_smg(engines)
            return
        if self.arrangement == "thunderagent":
            self._start_thunderagent(engines)
            return
        grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
        affinity = {
            "luftpause-no-affinity": "strict_affinity = false",
            "luftpause-idle-off": 'idle_affinity = "off"',
        }.get(self.arrangement, "")
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
        services = [("scheduler", status_port), ("dataplane", dp_port)]
        if self.runtime:
            mcp_port, rt_port = free_port(), free_port()
            self._child(
                ChildProcess(
                    "mcp",
                    ["fake-mcp", "--port", str(mcp_port)],
                    self.workdir / "mcp.log",
                    ready_port=("127.0.0.1", mcp_port),
                )
            )
            with config.open("a") as toml:
                toml.write(
                    f'\n[runtime]\nlisten = "127.0.0.1:{rt_port}"\ndataplane = "http://127.0.0.1:{dp_port}"\n'
                    f'state_dir = "{self.workdir / "state"}"\n'
                    f'\n[[mcp_servers]]\nname = "fake"\nurl = "http://127.0.0.1:{mcp_port}/mcp"\n'
                )
            services.append(("runtime", rt_port))
            self.runtime_url = f"http://127.0.0.1:{rt_port}/mcp"
        conf = ["--config", str(config)]
        for name, port in services:
            self._child(
                ChildProcess(
                    name,
                    [name, *conf],
                    self.workdir / f"{name}.log",
                    ready_url=f"http://127.0.0.1:{port}/health",
                )
            )
        self.url = f"http://127.0.0.1:{dp_port}"

    def _start_smg(self, engines: list[str]) -> None:
        """SGLang Model Gateway, configured as well as its documentation allows for this load:
        cache-aware routing, sticky sessions keyed by ``x-luftpause-run-id`` (a run's turns stay on
        the worker its first turn was routed to), and the priority-aware admission scheduler with
        the interactive agents' turns in class ``interactive`` and the batch agents' in ``bulk``
        (the agents send ``x-smg-priority``; tenants not listed may ask for up to ``interactive``).
        Its slot pool is the workers' ``max_running_requests`` summed (their ``/server_info``)."""
        config = self.workdir / "smg-priority.yaml"
        config.write_text(smg_yaml(self.interactive_agents))
        port = free_port()
        argv = [
            sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engines, "--policy", "cache_aware",
            "--sticky-sessions", "--routing-key-headers", "x-luftpause-run-id",
            "--priority-scheduler-enabled", "--priority-scheduler-config", str(config),
            "--priority-scheduler-default-max-class", "interactive",
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
            "--log-level", "warn",
        ]  # fmt: skip
        gateway = ChildProcess(
            "smg", argv, self.workdir / "smg.log", ready_url=f"http://127.0.0.1:{port}/health", program=()
        )
        self._child(gateway, timeout=60)
        self.url = f"http://127.0.0.1:{port}"

    def _start_thunderagent(self, engines: list[str]) -> None:
        """ThunderAgent's capacity scheduler (``--router tr``) over the engines as SGLang backends,
        reading their KV capacity from their server info and their load from ``/metrics``; the
        agents name each run as the body's ``program_id`` and release it at its end."""
        executable = _thunderagent()
        if executable is None:
            raise RuntimeError(unavailable("thunderagent"))
        port = free_port()
        argv = [
            executable, "--host", "127.0.0.1", "--port", str(port), "--backends", ",".join(engines),
            "--backend-type", "sglang", "--router", "tr", "--metrics", "--log-level", "warning",
        ]  # fmt: skip
        scheduler = ChildProcess(
            "thunderagent",
            argv,
            self.workdir / "thunderagent.log",
            ready_url=f"http://127.0.0.1:{port}/health",
            program=(),
        )
        self._child(scheduler, timeout=60)
        self.url = f"http://127.0.0.1:{port}"
