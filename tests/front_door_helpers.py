"""A scheduler and a dataplane (real processes, ``LUFTPAUSE_TOKEN`` set) in front of two simulated
engines, for the Messages and Responses routes' tests: one engine speaks only Chat Completions
(its turns are translated), the other serves both APIs natively (its turns are relayed unchanged).

Models (the model picks the path, and on the chat-only engine a fault of its own, since a
translated body cannot carry ``luftpause_fault``):

* :data:`TRANSLATED` on replica ``plain`` (``apis = ["chat"]``), and :data:`FAULTS` there;
* :data:`NATIVE` on replica ``native`` (``apis = ["chat", "messages", "responses"]``), where a
  fault rides in the client's body (``extra_body={"luftpause_fault": ...}``);
* :data:`DEAD` on a replica nobody listens on;
* :data:`NARROW` on the native engine behind a replica with ``max_inflight = 1``, so a second turn
  is held.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from dataplane_procs import SchedulerAndDataplane, fake_engine, scheduler_and_dataplane, wait_until

from luftpause.testkit.launch.procs import ChildProcess, free_port

TOKEN = "front-door-token"
TRANSLATED = "chat-only-model"
NATIVE = "native-model"
DEAD = "dead-model"
NARROW = "narrow-model"
FAULTS: dict[str, dict[str, Any]] = {
    "t-429": {"kind": "status", "status": 429, "retry_after": 7, "message": "slow down"},
    "t-503": {"kind": "status", "status": 503, "retry_after": 2, "message": "warming up"},
    "t-500": {"kind": "status", "status": 500, "message": "engine crashed"},
    "t-die": {"kind": "die_mid_stream", "after_chunks": 4},
    "t-error": {"kind": "error_mid_stream", "after_chunks": 4, "message": "out of KV"},
    "t-close": {"kind": "close"},
    "t-stall": {"kind": "stall", "seconds": 30},
}
"""The chat-only engine's fault models: model name -> the fault every request for it gets."""


@dataclass
class FrontDoorStack:
    pair: SchedulerAndDataplane
    engine_urls: dict[str, str]

    @property
    def url(self) -> str:
        return self.pair.dataplane_url

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.pair.status_url, timeout=10) as response:
            result: dict[str, Any] = orjson.loads(response.read())
            return result

    def settled(self, failed_before: int, expect: int = 1, key: str = "failed") -> dict[str, Any]:
        """``/status`` once ``counters[key]`` grew by ``expect`` and nothing is in flight (30 s at
        most, polled every 0.05 s)."""
        deadline = time.monotonic() + 30
        current = self.status()
        while time.monotonic() < deadline:
            if (
                current["counters"][key] - failed_before >= expect
                and sum(r["inflight"] for r in current["replicas"]) == 0
            ):
                break
            time.sleep(0.05)
            current = self.status()
        return current

    def engine_running(self, name: str) -> float:
        """Requests running at engine ``name`` (``plain`` or ``native``), from its ``/metrics``."""
        with urllib.request.urlopen(f"{self.engine_urls[name]}/metrics", timeout=10) as response:
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in response.read().decode().splitlines()
                if line.startswith("sglang:num_running_reqs{")
            )

    def kill_scheduler(self) -> None:
        """Kill the scheduler and wait until the dataplane has noticed (its next turns are held)."""
        self.pair.children["scheduler"].kill()
        if not wait_until(lambda: self.pair.health()["scheduler"] != "connected", 30):
            raise AssertionError(f"the dataplane never noticed the scheduler's death\n{self.pair.logs()}")

    def start_scheduler(self) -> None:
        """Start the scheduler again as before; wait until the dataplane is connected to it."""
        old = self.pair.children["scheduler"]
        again = ChildProcess(
            old.name, old.args, old.log_path, env=old.env, ready_url=old.ready_url, replace_env=True
        )
        self.pair.children["scheduler"] = again.start()
        again.wait_ready()
        if not wait_until(lambda: self.pair.health()["scheduler"] == "connected", 30):
            raise AssertionError(f"the dataplane did not reconnect\n{self.pair.logs()}")

    def sent(self, name: str, answer_id: str) -> bytes:
        """The exact bytes engine ``name`` sent for answer ``answer_id`` (``/testkit/sent``)."""
        with urllib.request.urlopen(f"{self.engine_urls[name]}/testkit/sent/{answer_id}", timeout=10) as r:
            data: bytes = r.read()
            return data


@contextmanager
def front_door_stack(workdir: Path, decode_ms: float = 2.0) -> Iterator[FrontDoorStack]:
    with ExitStack() as stack:
        fault_args = [
            arg for model, spec in FAULTS.items() for arg in ("--model-fault", f"{model}={json.dumps(spec)}")
        ]
        plain = stack.enter_context(
            fake_engine(
                workdir, decode_ms, ("--model", TRANSLATED, "--tool-rounds", "1", *fault_args), name="plain"
            )
        )
        native = stack.enter_context(
            fake_engine(
                workdir,
                decode_ms,
                ("--model", NATIVE, "--model", NARROW, "--apis", "messages,responses", "--tool-rounds", "1"),
                name="native",
            )
        )
        replicas = f"""
[[replicas]]
name = "plain"
url = "{plain}"
models = {json.dumps([TRANSLATED, *FAULTS])}

[[replicas]]
name = "native"
url = "{native}"
models = ["{NATIVE}"]
apis = ["chat", "messages", "responses"]

[[replicas]]
name = "narrow"
url = "{native}"
models = ["{NARROW}"]
apis = ["chat", "messages", "responses"]
max_inflight = 1

[[replicas]]
name = "dead"
url = "http://127.0.0.1:{free_port()}"
models = ["{DEAD}"]
health_path = ""
"""
        pair = stack.enter_context(
            scheduler_and_dataplane(workdir, [], replicas=replicas, env={"LUFTPAUSE_TOKEN": TOKEN})
        )
        yield FrontDoorStack(pair, {"plain": plain, "native": native})


def sse_events(body: bytes) -> list[dict[str, Any]]:
    """The ``data`` of every event of an SSE body (LF framing, as the translators and the
    simulator write it)."""
    return [orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]
