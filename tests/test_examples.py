"""The examples in ``examples/`` run against a real stack on the simulated engines.

Each example is an own-loop agent that sends ``x-luftpause-run-id``, ``x-luftpause-class`` and
``x-luftpause-caller`` on every turn. With the stack's engines set to two tool rounds, its task is
three turns: two tool rounds, then the answer. What proves those turns were scheduled as *one run
of the stated class*:

* every response carried the stated run id back (``x-luftpause-run-id``: the run the dataplane
  put the turn in);
* the scheduler's ``GET /status`` counts exactly one run more, of the stated class and none of
  the other, exactly one run of the stated caller (a caller name no other test uses), and as many
  more finished turns as the example made;
* the dataplane's ``/metrics`` counts that many more finished turns of that class.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from luftpause.testkit.stack import Stack

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TURNS = 3  # the shared stack's engines make two tool rounds before an answer


def finished_turns(stack: Stack, service_class: str) -> float:
    """``luftpause_dataplane_turns_total{outcome="finished", service_class=...}``."""
    with urllib.request.urlopen(f"{stack.dataplane_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "luftpause_dataplane_turns_total"
                and sample.labels.get("outcome") == "finished"
                and sample.labels.get("service_class") == service_class
            ):
                return sample.value
    return 0.0


@pytest.mark.integration
@pytest.mark.parametrize("example", ["openai_agent.py", "agents_sdk_agent.py", "langgraph_agent.py"])
def test_example_turns_are_one_run_of_its_class(stack: Stack, example: str) -> None:
    stack.wait_connected()
    run_id = f"{example.removesuffix('.py')}-{uuid.uuid4()}"
    caller = f"team-{run_id}"
    before = stack.status()
    metrics_before = finished_turns(stack, "batch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LUFTPAUSE_"))}
    env["LUFTPAUSE_BASE_URL"] = f"{stack.dataplane_url}/v1"
    result = subprocess.run(
        [
            *(sys.executable, str(EXAMPLES / example)),
            *("--run-id", run_id, "--service-class", "batch"),
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
    assert report["run_ids_returned"] == [run_id] * TURNS
    assert report["answer"].startswith("I saw ")  # the simulated engine's final answer

    after = stack.wait_status(lambda s: s["counters"]["finished"] >= before["counters"]["finished"] + TURNS)
    assert after["runs_by_class"]["batch"] == before["runs_by_class"]["batch"] + 1
    assert after["runs_by_class"]["interactive"] == before["runs_by_class"]["interactive"]
    assert after["runs_by_caller"].get(caller) == 1 and caller not in before["runs_by_caller"]
    assert sum(after["runs"].values()) == sum(before["runs"].values()) + 1
    assert after["counters"]["finished"] == before["counters"]["finished"] + TURNS
    assert finished_turns(stack, "batch") == metrics_before + TURNS
