"""A whole luftpause stack as real processes on free loopback ports, for tests and benchmarks.

``Stack.start(workdir)`` writes a configuration file, starts two simulated engines, the fake MCP
server, the scheduler, the dataplane and the runtime, and waits until each answers; ``stop()`` ends
them all. ``Stack`` is also a context manager. Every process (the stream clients too) dies with
the process that started the stack, even a SIGKILLed one (:mod:`luftpause.testkit.launch.procs`).

With ``LUFTPAUSE_TOKEN`` in ``env`` (or this process's environment) the stack's own requests
(:meth:`Stack.status`, :meth:`Stack.stream_clients`) carry it; with ``tls`` (:class:`StackTls`)
every luftpause listener serves TLS (and, with a client certificate, mutual TLS), the links
between them use it, and the URLs are ``https://``.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import ChildProcess, free_port, reap_with_this_process

_STREAM_CLIENT = """
import sys, ssl, urllib.request
headers = {"content-type": "application/json", "x-luftpause-run-id": sys.argv[3]}
if sys.argv[4]:
    headers["authorization"] = "Bearer " + sys.argv[4]
context = ssl.create_default_context(cafile=sys.argv[5]) if sys.argv[5] else None
request = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST", headers=headers)
try:
    with urllib.request.urlopen(request, timeout=60, context=context) as response:
        while response.read(4096):
            pass
except OSError:
    sys.exit(1)
"""


@dataclass(frozen=True)
class StackTls:
    """PEM files for TLS on a stack: ``cert``/``key`` (PKCS#8) the certificate every luftpause
    listener serves (one for ``127.0.0.1`` serves all), ``ca`` what its clients verify it with;
    with ``client_cert``/``client_key`` (signed by ``ca``) mutual TLS: every listener requires a
    client certificate signed by ``ca`` and the stack's links present this one."""

    cert: Path
    key: Path
    ca: Path
    client_cert: Path | None = None
    client_key: Path | None = None

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts ``ca`` (and presents the client certificate, if any)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client_cert is not None and self.client_key is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def config(self) -> dict[str, str]:
        """The TOML tables for every section, by section name."""
        listener = f'cert = "{self.cert}"\nkey = "{self.key}"\n'
        peer = f'ca = "{self.ca}"\n'
        if self.client_cert is not None:
            listener += f'client_ca = "{self.ca}"\n'
            peer += f'cert = "{self.client_cert}"\nkey = "{self.client_key}"\n'
        return {
            "scheduler": f"[scheduler.tls]\n{listener}",
            "dataplane": f"[dataplane.tls]\n{listener}[dataplane.scheduler_tls]\n{peer}",
            "runtime": f"[runtime.tls]\n{listener}[runtime.dataplane_tls]\n{peer}",
        }


@dataclass
class Stack:
    """URLs of a running stack; ``children`` in start order."""

    workdir: Path
    config_path: Path
    model: str
    engine_urls: list[str]
    mcp_url: str
    dataplane_url: str
    status_url: str
    runtime_url: str
    scheduler_grpc: str
    children: dict[str, ChildProcess] = field(default_factory=dict)
    token: str | None = None
    """The ``LUFTPAUSE_TOKEN`` the stack runs with (``None``: none)."""
    tls: StackTls | None = None

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        slots: int = 4,
        max_inflight: int = 32,
        tool_rounds: int = 2,
        decode_ms: float = 1.0,
        env: dict[str, str] | None = None,
        extra_config: str = "",
        api_key_env: str | None = None,
        sections: dict[str, str] | None = None,
        tls: StackTls | None = None,
        scheduler_config: str = "",
    ) -> Stack:
        """Start everything; raises ``RuntimeError`` (with the failing child's log) if one fails.

        ``extra_config`` is TOML appended to the generated file, e.g. more ``[[replicas]]``;
        ``sections`` adds lines to the ``scheduler``, ``dataplane`` or ``runtime`` table (keys,
        or sub-tables such as ``[dataplane.limits]``), ``scheduler_config`` to the ``[scheduler]``
        one (``trace = "..."``); ``api_key_env`` names the environment variable holding both
        replicas' upstream key; ``tls`` see :class:`StackTls`.
        """
        sections = dict(sections or {})
        if scheduler_config:
            sections["scheduler"] = f"{scheduler_config}\n{sections.get('scheduler', '')}"
        if tls is not None:
            for name, text in tls.config().items():
                sections[name] = f"{sections.get(name, '')}\n{text}"
        scheme = "https" if tls is not None else "http"
        context = tls.client_context() if tls is not None else None
        merged_env = {**os.environ, **(env or {})}
        workdir.mkdir(parents=True, exist_ok=True)
        engine_ports = [free_port(), free_port()]
        mcp_port, grpc_port, status_port, dp_port, rt_port = (free_port() for _ in range(5))
        replicas = "".join(
            f"""
[[replicas]]
name = "sim-{i}"
url = "http://127.0.0.1:{port}"
models = ["{DEFAULT_MODEL}"]
max_inflight = {max_inflight}
{f'api_key_env = "{api_key_env}"' if api_key_env else ""}
"""
            for i, port in enumerate(engine_ports)
        )
        config_path = workdir / "luftpause.toml"
        config_path.write_text(
            f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"
{sections.get("scheduler", "")}
[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"
{sections.get("dataplane", "")}
[runtime]
listen = "127.0.0.1:{rt_port}"
dataplane = "{scheme}://127.0.0.1:{dp_port}"
state_dir = "{workdir / "state"}"
{sections.get("runtime", "")}
{replicas}
[[mcp_servers]]
name = "fake"
url = "http://127.0.0.1:{mcp_port}/mcp"
{extra_config}
"""
        )
        stack = cls(
            workdir=workdir,
            config_path=config_path,
            model=DEFAULT_MODEL,
            engine_urls=[f"http://127.0.0.1:{p}" for p in engine_ports],
            mcp_url=f"http://127.0.0.1:{mcp_port}/mcp",
            dataplane_url=f"{scheme}://127.0.0.1:{dp_port}",
            status_url=f"{scheme}://127.0.0.1:{status_port}/status",
            runtime_url=f"{scheme}://127.0.0.1:{rt_port}/mcp",
            scheduler_grpc=f"127.0.0.1:{grpc_port}",
            token=merged_env.get("LUFTPAUSE_TOKEN") or None,
            tls=tls,
        )
        conf = ["--config", str(config_path)]
        plan: list[tuple[str, list[str], str | None, tuple[str, int] | None]] = [
            *(
                (
                    f"engine{i}",
                    [
                        "fake-engine",
                        "--port",
                        str(port),
                        "--model",
                        DEFAULT_MODEL,
                        "--slots",
                        str(slots),
                        "--decode-ms",
                        str(decode_ms),
                        "--tool-rounds",
                        str(tool_rounds),
                    ],
                    f"http://127.0.0.1:{port}/health",
                    None,
                )
                for i, port in enumerate(engine_ports)
            ),
            ("mcp", ["fake-mcp", "--port", str(mcp_port)], None, ("127.0.0.1", mcp_port)),
            ("scheduler", ["scheduler", *conf], f"{scheme}://127.0.0.1:{status_port}/health", None),
            ("dataplane", ["dataplane", *conf], f"{stack.dataplane_url}/health", None),
            ("runtime", ["runtime", *conf], f"{scheme}://127.0.0.1:{rt_port}/health", None),
        ]
        try:
            for name, argv, ready_url, ready_port in plan:
                child = ChildProcess(
                    name,
                    argv,
                    workdir / f"{name}.log",
                    env=env,
                    ready_url=ready_url,
                    ready_port=ready_port,
                    ready_context=context if name in ("scheduler", "dataplane", "runtime") else None,
                )
                stack.children[name] = child.start()
                child.wait_ready()
        except BaseException:
            stack.stop()
            raise
        return stack

    def stop(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop()

    @property
    def auth_headers(self) -> dict[str, str]:
        """``Authorization: Bearer <token>`` when the stack has a token, else nothing."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client context for the stack's ``https://`` URLs (``None`` without TLS)."""
        return self.tls.client_context() if self.tls is not None else None

    def status(self) -> dict[str, Any]:
        """The scheduler's ``GET /status`` JSON (with the stack's token)."""
        request = urllib.request.Request(self.status_url, headers=self.auth_headers)
        with urllib.request.urlopen(request, timeout=10, context=self.ssl_context) as response:
            result: dict[str, Any] = orjson.loads(response.read())
            return result

    def wait_status(self, check: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        """Poll ``/status`` until ``check`` holds or ``timeout`` seconds pass; the last status.

        The deadline is generous for a loaded 2-core machine (only a failing test waits it out);
        the poll itself is every 0.1 s."""
        deadline = time.monotonic() + timeout
        status = self.status()
        while not check(status) and time.monotonic() < deadline:
            time.sleep(0.1)
            status = self.status()
        return status

    def wait_connected(self, timeout: float = 30.0) -> None:
        """Wait until the dataplane has resynced with the scheduler; ``AssertionError`` if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = f"{self.dataplane_url}/health"
            with urllib.request.urlopen(health, timeout=10, context=self.ssl_context) as response:
                if orjson.loads(response.read())["scheduler"] == "connected":
                    return
            time.sleep(0.05)
        raise AssertionError(f"the dataplane did not resync with the scheduler:\n{self.logs()}")

    def restart(self, name: str) -> None:
        """Stop child ``name`` (if still running), start it again as before, wait until it answers
        and the dataplane is connected to the scheduler."""
        old = self.children[name]
        old.stop()
        # The same readiness check as before: the fake MCP server is ready by its port, not a URL
        # (without ready_port, its restart returned before it listened).
        again = ChildProcess(
            name,
            old.args,
            old.log_path,
            env=old.env,
            ready_url=old.ready_url,
            ready_port=old.ready_port,
            program=old.program,
            cwd=old.cwd,
            replace_env=True,
            ready_context=old.ready_context,
        )
        self.children[name] = again.start()
        again.wait_ready()
        self.wait_connected()

    def stream_clients(
        self, count: int, max_tokens: int, run_prefix: str = "stream"
    ) -> list[subprocess.Popen[bytes]]:
        """``count`` streamed turns through the dataplane, each read to its end by its own process
        (so it outlives whatever a test kills); run ids ``<run_prefix>-<i>``. Exit 0 = read to
        the end, 1 = the connection failed. The caller ends them."""
        body = orjson.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens,
                "stream": True,
            }
        ).decode()
        url = f"{self.dataplane_url}/v1/chat/completions"
        ca = str(self.tls.ca) if self.tls is not None else ""
        clients = []
        for i in range(count):
            client = subprocess.Popen(
                [sys.executable, "-c", _STREAM_CLIENT, url, body, f"{run_prefix}-{i}", self.token or "", ca],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            reap_with_this_process(client)
            clients.append(client)
        return clients

    def logs(self) -> str:
        """Every child's log tail, for a failing test's message."""
        return "\n".join(f"--- {name}\n{child.log_tail()}" for name, child in self.children.items())

    def __enter__(self) -> Stack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
