"""A scheduler and a dataplane as real processes in front of given engines, for the dataplane's
integration tests that stop, kill or watch one of them (the shared ``Stack`` is too big for that).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import ChildProcess, free_port

MODEL = DEFAULT_MODEL


@dataclass
class SchedulerAndDataplane:
    """URLs of the running pair; ``children`` in start order (scheduler first)."""

    dataplane_url: str
    status_url: str
    children: dict[str, ChildProcess] = field(default_factory=dict)

    def health(self) -> dict[str, Any]:
        """The dataplane's ``GET /health`` JSON."""
        with urllib.request.urlopen(f"{self.dataplane_url}/health", timeout=10) as response:
            result: dict[str, Any] = orjson.loads(response.read())
            return result

    def counters(self) -> dict[str, int]:
        """The scheduler's ``/status`` counters (turns finished, failed, held, ...)."""
        with urllib.request.urlopen(self.status_url, timeout=10) as response:
            counters: dict[str, int] = orjson.loads(response.read())["counters"]
            return counters

    def metric(self, line_prefix: str) -> float:
        """The value of the first line of the dataplane's ``/metrics`` starting with ``line_prefix``
        (a name with its labels, e.g. ``'luftpause_dataplane_turns_held '``); 0 when absent."""
        with urllib.request.urlopen(f"{self.dataplane_url}/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(line_prefix):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def complete(self, run_id: str | None = None, max_tokens: int = 2, timeout: float = 60) -> int:
        """One non-streamed turn through the dataplane; its HTTP status."""
        headers = {"content-type": "application/json"}
        if run_id is not None:
            headers["x-luftpause-run-id"] = run_id
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        request = urllib.request.Request(
            f"{self.dataplane_url}/v1/chat/completions",
            data=orjson.dumps(body),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{child.log_tail()}" for name, child in self.children.items())


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    """Poll ``check`` every 0.1 s until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextmanager
def scheduler_and_dataplane(
    workdir: Path,
    engine_urls: list[str],
    max_inflight: int = 4,
    replicas: str | None = None,
    env: dict[str, str] | None = None,
    dataplane: str = "",
    scheduler: str = "",
) -> Iterator[SchedulerAndDataplane]:
    """Start a scheduler and a dataplane (one replica per engine URL, serving :data:`MODEL`, or the
    ``[[replicas]]`` TOML given as ``replicas``; ``env`` added to the dataplane's environment;
    ``dataplane``: more lines of its ``[dataplane]`` table; ``scheduler``: TOML after the
    ``[scheduler]`` table, e.g. a ``[scheduler.protection]`` table), wait
    until the dataplane is connected; stop both at the end, even on failure."""
    grpc_port, status_port, dp_port = free_port(), free_port(), free_port()
    if replicas is None:
        replicas = "".join(
            f'\n[[replicas]]\nname = "sim-{i}"\nurl = "{url}"\nmodels = ["{MODEL}"]\n'
            f"max_inflight = {max_inflight}\n"
            for i, url in enumerate(engine_urls)
        )
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"
{scheduler}
[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"
{dataplane}
{replicas}"""
    )
    pair = SchedulerAndDataplane(f"http://127.0.0.1:{dp_port}", f"http://127.0.0.1:{status_port}/status")
    conf = ["--config", str(config)]
    try:
        for name, ready in (
            ("scheduler", f"http://127.0.0.1:{status_port}/health"),
            ("dataplane", f"{pair.dataplane_url}/health"),
        ):
            child = ChildProcess(
                name,
                [name, *conf],
                workdir / f"{name}.log",
                env=env if name == "dataplane" else None,
                ready_url=ready,
            )
            pair.children[name] = child.start()
            child.wait_ready()
        if not wait_until(lambda: pair.health()["scheduler"] == "connected", 30):  # /health needs no token
            raise RuntimeError(f"the dataplane did not connect:\n{pair.logs()}")
        yield pair
    finally:
        for child in reversed(list(pair.children.values())):
            child.stop()


@contextmanager
def fake_engine(
    workdir: Path, decode_ms: float = 1.0, args: tuple[str, ...] = ("--model", MODEL), name: str = "engine"
) -> Iterator[str]:
    """A simulated engine process (``luftpause fake-engine``, with ``args``, by default serving
    :data:`MODEL`); its URL. Stopped at the end."""
    port = free_port()
    engine = ChildProcess(
        name,
        ["fake-engine", "--port", str(port), "--decode-ms", str(decode_ms), *args],
        workdir / f"{name}.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        engine.start().wait_ready()
        yield f"http://127.0.0.1:{port}"
    finally:
        engine.stop()
