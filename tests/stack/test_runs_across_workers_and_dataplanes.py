"""An agent that sends no run id keeps its run, and its replica, whichever worker or dataplane each
of its turns reaches (real processes, the real ``openai`` client; docs/operating.md "Several
workers and several dataplanes").

The agent names no run: each next turn is found on its run by the tool-call ids it answers. Those
ids were emitted by a turn another worker or dataplane relayed, so the turn's own one does not
know them and asks the scheduler (``AdmitRequest.tool_call_ids``). The turns are forced apart: a
new connection per turn for the workers of one dataplane (the kernel spreads connections among
them), alternate base URLs for two dataplanes. Two replicas serve the model, so a turn taken for a
new run could land on the other one.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from luftpause.testkit.launch.procs import ChildProcess, free_port
from tests.dataplane_procs import MODEL, fake_engine, wait_until

pytestmark = pytest.mark.integration

TOOL_ROUNDS = 12
"""Tool rounds the engines ask for before a final answer: the agent's turns are this plus one."""
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
GRACE_S = 2.0


@dataclass
class Cluster:
    """A scheduler, two engines and dataplanes, as processes; URLs of each."""

    status_url: str
    engine_urls: list[str]
    dataplane_urls: list[str] = field(default_factory=list)
    children: dict[str, ChildProcess] = field(default_factory=dict)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=10) as response:
            result: dict[str, Any] = orjson.loads(response.read())
            return result

    def served_by(self, completion_id: str) -> int:
        """Index of the engine that answered ``completion_id``."""
        for index, url in enumerate(self.engine_urls):
            try:
                with urllib.request.urlopen(f"{url}/testkit/sent/{completion_id}", timeout=10):
                    return index
            except urllib.error.HTTPError:
                continue
        raise AssertionError(f"no engine answered {completion_id}")

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{child.log_tail()}" for name, child in self.children.items())


@contextmanager
def cluster(workdir: Path, dataplanes: list[str]) -> Iterator[Cluster]:
    """A scheduler (dataplane grace ``GRACE_S``), two engines, and one dataplane per entry of
    ``dataplanes`` (more lines of its ``[dataplane]`` table), each its own process and
    configuration file; waits until the scheduler counts every dataplane's links connected."""
    grpc_port, status_port = free_port(), free_port()
    with ExitStack() as stack:
        engines = [
            stack.enter_context(
                fake_engine(
                    workdir,
                    args=("--model", MODEL, "--tool-rounds", str(TOOL_ROUNDS)),
                    name=f"engine{i}",
                )
            )
            for i in range(2)
        ]
        replicas = "".join(
            f'\n[[replicas]]\nname = "sim-{i}"\nurl = "{url}"\nmodels = ["{MODEL}"]\nmax_inflight = 8\n'
            for i, url in enumerate(engines)
        )
        found = Cluster(f"http://127.0.0.1:{status_port}/status", engines)
        try:
            config = workdir / "scheduler.toml"
            config.write_text(
                f'[scheduler]\ngrpc = "127.0.0.1:{grpc_port}"\nhttp = "127.0.0.1:{status_port}"\n'
                f"dataplane_grace_s = {GRACE_S}\n{replicas}"
            )
            scheduler = ChildProcess(
                "scheduler",
                ["scheduler", "--config", str(config)],
                workdir / "scheduler.log",
                ready_url=f"http://127.0.0.1:{status_port}/health",
            )
            found.children["scheduler"] = scheduler.start()
            scheduler.wait_ready()
            links = 0
            for i, lines in enumerate(dataplanes):
                port = free_port()
                config = workdir / f"dataplane{i}.toml"
                config.write_text(
                    f'[dataplane]\nlisten = "127.0.0.1:{port}"\nscheduler = "127.0.0.1:{grpc_port}"\n'
                    f"{lines}\n{replicas}"
                )
                url = f"http://127.0.0.1:{port}"
                child = ChildProcess(
                    f"dataplane{i}",
                    ["dataplane", "--config", str(config)],
                    workdir / f"dataplane{i}.log",
                    ready_url=f"{url}/health",
                )
                found.children[f"dataplane{i}"] = child.start()
                child.wait_ready()
                found.dataplane_urls.append(url)
                links += int(lines.split("workers = ")[1].split()[0]) if "workers = " in lines else 1
            if not wait_until(lambda: _connected(found.status()) == links, 30):
                raise RuntimeError(f"the dataplanes did not all connect:\n{found.logs()}")
            yield found
        finally:
            for child in reversed(list(found.children.values())):
                child.stop()


def _connected(status: dict[str, Any]) -> int:
    return sum(1 for dataplane in status["dataplanes"] if dataplane["connected"])


@dataclass
class Agent:
    """An own-loop agent on the ``openai`` client that never names its run: it answers each tool
    call and sends the conversation back, each turn through ``clients[i % len(clients)]``."""

    clients: list[openai.OpenAI]
    messages: list[Any] = field(default_factory=lambda: [{"role": "user", "content": "What is a fjord?"}])
    turns: int = 0

    def turn(self) -> tuple[str, str, str]:
        """One turn: (its run id as answered, its completion id, its finish reason)."""
        client = self.clients[self.turns % len(self.clients)]
        self.turns += 1
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=self.messages, tools=[LOOKUP_TOOL], max_tokens=40
        )
        completion = raw.parse()
        choice = completion.choices[0]
        self.messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls or []:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": "A narrow inlet."})
        return raw.headers["x-luftpause-run-id"], completion.id, choice.finish_reason


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(base_url: str, fresh_connections: bool = False) -> openai.OpenAI:
    """The ``openai`` client on ``base_url`` (closed after the test); ``fresh_connections``: no
    connection is kept, so every turn opens a new one (and the kernel may hand it to any worker)."""
    limits = httpx.Limits(max_keepalive_connections=0) if fresh_connections else None
    http = openai.DefaultHttpxClient(limits=limits) if limits is not None else None
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, http_client=http)
    _OPEN.append(client)
    return client


def _run_to_its_end(cluster_: Cluster, agent: Agent) -> tuple[set[str], set[int]]:
    """Every turn of ``agent``: the run ids answered and the engines that served them."""
    runs: set[str] = set()
    engines: set[int] = set()
    for _ in range(TOOL_ROUNDS + 1):
        run_id, completion_id, finish_reason = agent.turn()
        runs.add(run_id)
        engines.add(cluster_.served_by(completion_id))
        if finish_reason != "tool_calls":
            break
    assert finish_reason == "stop", f"the agent's run did not come to its answer\n{cluster_.logs()}"
    return runs, engines


def test_with_two_workers_an_agent_keeps_its_run_and_replica_across_workers(tmp_path: Path) -> None:
    with cluster(tmp_path, ["workers = 2"]) as running:
        status = running.status()
        ids = sorted(d["id"] for d in status["dataplanes"])
        assert len(ids) == 2 and ids[0].endswith("-w0") and ids[1].endswith("-w1"), ids

        agent = Agent([_client(running.dataplane_urls[0], fresh_connections=True)])
        runs, engines = _run_to_its_end(running, agent)

        assert len(runs) == 1, f"the run changed between turns: {runs}\n{running.logs()}"
        assert len(engines) == 1, f"the run's turns left its replica: {engines}"
        after = running.status()
        # the turns did land on both workers, and at least one reached a worker that had not
        # relayed the turn before it (the scheduler named its run)
        assert all(d["turns_total"] > 0 for d in after["dataplanes"]), after["dataplanes"]
        assert after["tool_call_runs"]["found"] >= 1, after["tool_call_runs"]
        # the last turn's end may still wait to share a message with others (a few ms)
        assert wait_until(lambda: running.status()["counters"]["finished"] == agent.turns, 10)
        assert sum(after["runs"].values()) == 1, after["runs"]


def test_with_two_dataplanes_an_agent_keeps_its_run_and_replica_across_them(tmp_path: Path) -> None:
    with cluster(tmp_path, ["", ""]) as running:
        agent = Agent([_client(url) for url in running.dataplane_urls])
        runs, engines = _run_to_its_end(running, agent)

        assert len(runs) == 1, f"the run changed between turns: {runs}\n{running.logs()}"
        assert len(engines) == 1, f"the run's turns left its replica: {engines}"
        after = running.status()
        # every turn after the first reached the dataplane that had not relayed the one before it
        assert after["tool_call_runs"]["found"] == agent.turns - 1, after["tool_call_runs"]
        assert sorted(d["turns_total"] for d in after["dataplanes"]) == [
            agent.turns // 2,
            (agent.turns + 1) // 2,
        ]
        assert sum(after["runs"].values()) == 1, after["runs"]


def test_a_dead_dataplanes_turns_are_released_and_its_runs_go_on_elsewhere(tmp_path: Path) -> None:
    with cluster(tmp_path, ["", ""]) as running:
        first, second = running.dataplane_urls
        agent = Agent([_client(first)])
        run_id, completion_id, finish_reason = agent.turn()
        assert finish_reason == "tool_calls"
        replica = running.served_by(completion_id)

        # a long stream in flight on the first dataplane when it dies
        stream = _client(first).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me at length."}],
            max_tokens=4000,
            stream=True,
        )
        next(iter(stream))

        def busy() -> list[str]:  # the scheduler hears of the turn in flight a moment after its bytes
            return [d["id"] for d in running.status()["dataplanes"] if d["turns_in_flight"] >= 1]

        assert wait_until(lambda: len(busy()) == 1, 20), running.status()["dataplanes"]
        (dead_id,) = busy()
        running.children["dataplane0"].kill()
        stream.close()

        def released(status: dict[str, Any]) -> bool:
            dead = next(d for d in status["dataplanes"] if d["id"] == dead_id)
            return not dead["connected"] and dead["turns_in_flight"] == 0 and dead["lost_s"] is None

        assert wait_until(lambda: released(running.status()), GRACE_S + 20), running.status()["dataplanes"]
        assert running.status()["counters"]["turns_released_lost_dataplane"] == 1

        # the run's next turn reaches the other dataplane: still its run, still its replica
        agent.clients = [_client(second)]
        again, completion_id, _ = agent.turn()
        assert again == run_id
        assert running.served_by(completion_id) == replica
        assert running.status()["tool_call_runs"]["found"] == 1
