"""The examples in ``examples/`` run against a real stack on the simulated engines.

Each example is an own-loop agent that sends ``x-luftpause-run-id``, ``x-luftpause-class`` and
``x-luftpause-caller`` on every turn. With the stack's engines set to two tool rounds, its task is
three turns: two tool rounds, then the answer. What proves those turns were scheduled as *one run
of the stated class*:

* every request carried all three headers with the stated values: the example talks to the
  dataplane through a recording proxy in this test, which keeps each request's headers. Responses
  carrying the stated run id back would not prove it: a turn that answers a tool call joins the run
  that emitted the call (the dataplane's identity by ``tool_call_id``), so an example that sent the
  run id on its first turn only would get it back on every turn;
* every response carried the stated run id back (``x-luftpause-run-id``: the run the dataplane
  put the turn in);
* the scheduler's ``GET /status`` counts exactly one run more, of the stated class and none of
  the other, exactly one run of the stated caller (a caller name no other test uses), and as many
  more finished turns as the example made;
* the dataplane's ``/metrics`` counts that many more finished turns of that class.

Each example runs once as ``batch`` and once as ``interactive``.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client.parser import text_string_to_metric_families
from repo_paths import ROOT

from luftpause.testkit.launch.procs import free_port
from luftpause.testkit.launch.stack import Stack

EXAMPLES = ROOT / "examples"
TURNS = 3  # the shared stack's engines make two tool rounds before an answer


def finished_turns(stack: Stack, service_class: str) -> float:
    """``luftpause_dataplane_turns_total{outcome="finished", service_class=...}``, summed over the
    replicas the turns went to."""
    with urllib.request.urlopen(f"{stack.dataplane_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "luftpause_dataplane_turns_total"
        and sample.labels.get("outcome") == "finished"
        and sample.labels.get("service_class") == service_class
    )


_HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection", "te")
)


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP/1.1 proxy on a free loopback port in front of ``upstream`` (``http://host:port``):
    its base URL and the headers (lower-case names) of every ``POST`` it forwarded, in order. Each
    answer is read whole from upstream and sent on with its status and headers (a streamed answer
    arrives at once, complete)."""
    host, _, port = upstream.removeprefix("http://").partition(":")
    recorded: list[dict[str, str]] = []

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorded.append(headers)
            body = self.rfile.read(int(headers.get("content-length", "0")))
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                sent = {k: v for k, v in headers.items() if k not in _HOP_BY_HOP}
                connection.request("POST", self.path, body=body, headers=sent)
                answer = connection.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                connection.close()

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: pytest's output is the test's

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Forward)
    thread = threading.Thread(target=server.serve_forever, name="recording-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", recorded
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.integration
@pytest.mark.parametrize("service_class", ["batch", "interactive"])
@pytest.mark.parametrize("example", ["openai_agent.py", "agents_sdk_agent.py", "langgraph_agent.py"])
def test_example_turns_are_one_run_of_its_class(stack: Stack, example: str, service_class: str) -> None:
    other_class = "interactive" if service_class == "batch" else "batch"
    stack.wait_connected()
    run_id = f"{example.removesuffix('.py')}-{uuid.uuid4()}"
    caller = f"team-{run_id}"
    before = stack.status()
    metrics_before = finished_turns(stack, service_class)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LUFTPAUSE_"))}
    with recording_proxy(stack.dataplane_url) as (proxy_url, requests):
        env["LUFTPAUSE_BASE_URL"] = f"{proxy_url}/v1"
        result = subprocess.run(
            [
                *(sys.executable, str(EXAMPLES / example)),
                *("--run-id", run_id, "--service-class", service_class),
                *("--caller", caller, "--model", stack.model),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert result.returncode == 0, f"{result.stderr}\n{stack.logs()}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["turns"] == TURNS
    # every turn itself said its run, class and caller (not only the first: see the docstring)
    stated = {"x-luftpause-run-id": run_id, "x-luftpause-class": service_class, "x-luftpause-caller": caller}
    assert len(requests) == TURNS
    for headers in requests:
        assert {name: headers.get(name) for name in stated} == stated
    assert report["run_ids_returned"] == [run_id] * TURNS
    assert report["answer"].startswith("I saw ")  # the simulated engine's final answer

    # The scheduler hears of a turn's end on the dataplane's stream, and the dataplane counts it in
    # /metrics when its relay ends, either maybe just after the client read the answer: wait for both.
    after = stack.wait_status(
        lambda s: (
            s["counters"]["finished"] >= before["counters"]["finished"] + TURNS
            and finished_turns(stack, service_class) >= metrics_before + TURNS
        )
    )
    assert after["runs_by_class"][service_class] == before["runs_by_class"][service_class] + 1
    assert after["runs_by_class"][other_class] == before["runs_by_class"][other_class]
    assert after["runs_by_caller"].get(caller) == 1 and caller not in before["runs_by_caller"]
    assert sum(after["runs"].values()) == sum(before["runs"].values()) + 1
    assert after["counters"]["finished"] == before["counters"]["finished"] + TURNS
    assert finished_turns(stack, service_class) == metrics_before + TURNS
