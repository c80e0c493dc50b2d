"""The three processes' ``/metrics`` on a real stack, scraped as an operator's Prometheus would.

One stack of real processes on free loopback ports (the simulated engines, the fake MCP server and
a second one, ``danger``, with a destructive tool), driven through the real ``mcp`` client and the
dataplane: runs that use tools, wait for an approval and run out of a budget, and a turn for a
model no replica serves. Then:

* what each process counts agrees with what was done, and across processes (the dataplane's
  finished turns are the scheduler's, the runtime's tool calls the runs' own);
* the "Metrics" list of docs/operating.md is exactly what the processes expose: names, types and labels;
* every metric the Grafana dashboard and the Prometheus rules name is one the processes expose
  (or a recording rule's, or Prometheus' own ``up``);
* a real Prometheus (Debian's binary; skipped, saying why, where it is absent) scrapes all three,
  loads the rules and evaluates every one without error, and answers one series of each process
  and every query of the dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from dataplane_procs import wait_until
from deploy_helpers import DASHBOARD, PROMETHEUS, dashboard_queries
from mcp import Client
from mcp.types import CallToolResult, TextContent
from prometheus_client.parser import text_string_to_metric_families
from repo_paths import ROOT
from runtime_helpers import stack_with_destructive_tools

from luftpause.runtime.runs.journal import JOURNAL_NAME
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

PROMETHEUS_BINARY = shutil.which("prometheus")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Family:
    """One metric family as exposed: its name as queried (counters with ``_total``), type, and
    the label names its samples carry (``le`` aside; empty set when it had no sample)."""

    name: str
    type: str
    labels: frozenset[str]
    sampled: bool


def metrics_url(stack: Stack, process: str) -> str:
    base = {
        "scheduler": stack.status_url.removesuffix("/status"),
        "dataplane": stack.dataplane_url,
        "runtime": stack.runtime_url.removesuffix("/mcp"),
    }[process]
    return f"{base}/metrics"


def scrape_text(stack: Stack, process: str) -> str:
    with urllib.request.urlopen(metrics_url(stack, process), timeout=10) as response:
        assert response.headers["content-type"].startswith("text/plain; version=")
        text: str = response.read().decode()
        return text


def samples(stack: Stack, process: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scrape_text(stack, process))
        for sample in family.samples
    }


def families(stack: Stack, process: str) -> dict[str, Family]:
    out = {}
    for family in text_string_to_metric_families(scrape_text(stack, process)):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = frozenset(label for sample in family.samples for label in sample.labels if label != "le")
        out[name] = Family(name, family.type, labels, bool(family.samples))
    return out


def total(found: Samples, name: str, **labels: str) -> float:
    """``name``'s samples whose labels include ``labels``, summed."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in found.items() if sample == name and wanted <= set(have))


def _payload(result: CallToolResult) -> dict[str, Any]:
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    assert not result.is_error, text
    assert isinstance(result.structured_content, dict), text
    return result.structured_content


@dataclass
class Driven:
    """The stack, its scrapes before and after the workload, what the workload saw."""

    stack: Stack
    before: dict[str, Samples]
    after: dict[str, Samples]
    runs: list[dict[str, Any]]
    waiting: Samples
    """The runtime's samples while one run waited for its approval, inside an MCP session."""
    refused_status: int


PROCESSES = ("scheduler", "dataplane", "runtime")


def _drive(stack: Stack) -> tuple[list[dict[str, Any]], Samples]:
    """Three runs through the real MCP client (a 2025-era session): one with tools to its
    answer, one that waits for an approval (refused), one cancelled by its tool-call budget."""

    async def go() -> tuple[list[dict[str, Any]], Samples]:
        async with Client(stack.runtime_url, mode="legacy") as client:

            async def until_done(handle: str) -> dict[str, Any]:
                waited = await client.call_tool(
                    "await", {"handles": [handle], "timeout": 60}, read_timeout_seconds=90
                )
                run: dict[str, Any] = _payload(waited)["runs"][0]
                return run

            spawned = await client.call_tool(
                "spawn", {"task": "look it up", "tools": ["lookup"], "maxTokens": 16}
            )
            plain = await until_done(_payload(spawned)["handle"])
            spawned = await client.call_tool(
                "spawn",
                {"task": "remove the old note", "tools": ["delete_note"], "maxToolCalls": 1, "maxTokens": 16},
            )
            handle = _payload(spawned)["handle"]
            waiting_run = await until_done(handle)
            assert waiting_run["state"] == "AwaitingApproval", waiting_run
            waiting = samples(stack, "runtime")
            _payload(await client.call_tool("approve", {"handle": handle, "allow": False}))
            refused = await until_done(handle)
            spawned = await client.call_tool(
                "spawn", {"task": "dig", "tools": ["lookup"], "budgetToolCalls": 1}
            )
            cancelled = await until_done(_payload(spawned)["handle"])
            return [plain, refused, cancelled], waiting

    return asyncio.run(go())


def _refused_turn(stack: Stack) -> int:
    body = orjson.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        f"{stack.dataplane_url}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _settled(stack: Stack) -> bool:
    """Nothing in flight anywhere, the engines' last probe after the last turn (so it reads no
    running request), and the journal's size on disk as the runtime reports it."""
    dataplane = samples(stack, "dataplane")
    runtime = samples(stack, "runtime")
    scheduler = samples(stack, "scheduler")
    journal = stack.workdir / "state" / JOURNAL_NAME
    return (
        total(dataplane, "luftpause_dataplane_turns_in_flight") == 0
        and total(scheduler, "luftpause_scheduler_replica_engine_running") == 0
        and total(runtime, "luftpause_runtime_runs", state="running") == 0
        and total(runtime, "luftpause_runtime_journal_bytes") == journal.stat().st_size
    )


@pytest.fixture(scope="module")
def driven(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driven]:
    with stack_with_destructive_tools(tmp_path_factory.mktemp("metrics")) as (stack, _):
        stack.wait_connected()
        assert wait_until(lambda: _settled(stack), 30), stack.logs()
        before = {process: samples(stack, process) for process in PROCESSES}
        runs, waiting = _drive(stack)
        refused = _refused_turn(stack)
        assert wait_until(lambda: _settled(stack), 30), stack.logs()
        after = {process: samples(stack, process) for process in PROCESSES}
        yield Driven(stack, before, after, runs, waiting, refused)


def delta(driven: Driven, process: str, name: str, **labels: str) -> float:
    return total(driven.after[process], name, **labels) - total(driven.before[process], name, **labels)


def test_the_runtime_counts_runs_turns_tool_calls_by_server_budgets_approvals_and_sessions(
    driven: Driven,
) -> None:
    plain, refused, cancelled = driven.runs
    assert (plain["state"], refused["state"], cancelled["state"]) == ("completed", "completed", "cancelled")
    d = lambda name, **labels: delta(driven, "runtime", name, **labels)  # noqa: E731
    assert d("luftpause_runtime_runs_started_total") == 3
    assert d("luftpause_runtime_runs_ended_total", state="completed") == 2
    assert d("luftpause_runtime_runs_ended_total", state="cancelled") == 1
    assert d("luftpause_runtime_runs", state="cancelled") == 1
    assert d("luftpause_runtime_budget_cancellations_total", budget="toolCalls") == 1
    assert d("luftpause_runtime_budget_cancellations_total") == 1
    assert d("luftpause_runtime_turns_total", outcome="answered") == sum(run["turns"] for run in driven.runs)
    assert d("luftpause_runtime_turns_total", outcome="failed") == 0
    # every call the models made is counted once, under the server it went to; the refused
    # approval reached none
    assert d("luftpause_runtime_tool_calls_total") == sum(run["toolCalls"] for run in driven.runs)
    assert d("luftpause_runtime_tool_errors_total") == sum(run["failedToolCalls"] for run in driven.runs)
    assert (
        d("luftpause_runtime_tool_calls_total", server="fake")
        == plain["toolCalls"] + cancelled["toolCalls"]
        > 0
    )
    assert d("luftpause_runtime_tool_calls_total", server="none") == 1
    assert d("luftpause_runtime_tool_errors_total", server="none") == 1
    assert d("luftpause_runtime_tool_calls_total", server="danger") == 0
    # while the run waited for its person, inside the client's session
    assert total(driven.waiting, "luftpause_runtime_approvals_waiting") == 1
    assert total(driven.waiting, "luftpause_runtime_mcp_sessions") >= 1
    after = driven.after["runtime"]
    assert total(after, "luftpause_runtime_approvals_waiting") == 0
    journal = driven.stack.workdir / "state" / JOURNAL_NAME
    assert total(after, "luftpause_runtime_journal_bytes") == journal.stat().st_size > 0
    assert total(after, "luftpause_runtime_retained_bytes") > 0
    assert total(after, "luftpause_runtime_upstream_connected", server="fake") == 1
    assert total(after, "luftpause_runtime_upstream_connected", server="danger") == 1


def test_the_dataplane_and_the_scheduler_count_the_same_turns_by_replica(driven: Driven) -> None:
    dp = lambda name, **labels: delta(driven, "dataplane", name, **labels)  # noqa: E731
    sched = lambda name, **labels: delta(driven, "scheduler", name, **labels)  # noqa: E731
    finished = dp("luftpause_dataplane_turns_total", outcome="finished")
    runtime_turns = delta(driven, "runtime", "luftpause_runtime_turns_total", outcome="answered")
    assert finished == runtime_turns > 0  # every sub-agent turn went through this dataplane
    assert sched("luftpause_scheduler_turns_ended_total", outcome="finished") == finished
    # by replica: only the configured ones finish turns, and each turn's first token is timed there
    by_replica = {
        dict(labels)["replica"]: value
        for (name, labels), value in driven.after["dataplane"].items()
        if name == "luftpause_dataplane_turns_total" and dict(labels)["outcome"] == "finished"
    }
    assert set(by_replica) == {"sim-0", "sim-1"}
    ttft = "luftpause_dataplane_time_to_first_token_seconds_count"
    assert dp(ttft) == finished
    assert dp(ttft, replica="sim-0") + dp(ttft, replica="sim-1") == finished
    # placed by the scheduler or under a lease, on the same replicas
    placed = sched("luftpause_scheduler_placements_total")
    assert placed == sched("luftpause_scheduler_turns_arrived_total") == finished
    assert sched("luftpause_scheduler_placements_total", replica="sim-0") == dp(
        "luftpause_dataplane_turns_total", outcome="finished", replica="sim-0"
    )
    # the turn for a model no replica serves: refused by the scheduler, counted on both sides
    assert driven.refused_status == 404
    assert dp("luftpause_dataplane_turns_total", outcome="refused", replica="") == 1
    assert sched("luftpause_scheduler_rejections_total", reason="unknown_model") == 1
    after = driven.after["scheduler"]
    for replica in ("sim-0", "sim-1"):
        assert total(after, "luftpause_scheduler_replica_healthy", replica=replica) == 1
        assert total(after, "luftpause_scheduler_replica_probe_age_seconds", replica=replica) < 10
        assert total(after, "luftpause_scheduler_replica_engine_running", replica=replica) == 0
    dataplane = driven.after["dataplane"]
    assert total(dataplane, "luftpause_dataplane_scheduler_connected") == 1
    assert total(dataplane, "luftpause_dataplane_healthy_replicas") == 2


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not found (Debian: apt-get install prometheus)")
@pytest.mark.parametrize("process", PROCESSES)
def test_promtool_check_metrics_accepts_what_each_process_serves(driven: Driven, process: str) -> None:
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=scrape_text(driven.stack, process),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_process_has_its_process_collectors_and_no_created_series(driven: Driven) -> None:
    for process in PROCESSES:
        found = driven.after[process]
        names = {name for name, _ in found}
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names, process
        assert total(found, "luftpause_build_info", process=process) == 1
        assert not [name for name in names if name.endswith("_created")], process
        own = {name for name in names if name.startswith("luftpause_")}
        assert all(name.startswith((f"luftpause_{process}_", "luftpause_build_info")) for name in own), own


README_ROW = re.compile(
    r"^\| `((?:luftpause|gen_ai)_[a-z_]+)` \| (counter|gauge|histogram) \|([^|]*)\|", re.MULTILINE
)
OPERATING_METRICS = ROOT / "docs" / "operating-metrics.md"
"""Where the dataplane's GenAI families and token counters are listed (their own table)."""


def readme_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    text = (ROOT / "docs" / "operating.md").read_text()
    sections = [text.split("\n### Metrics\n", 1)[1].split("\n## ", 1)[0], OPERATING_METRICS.read_text()]
    return {
        name: (kind, frozenset(re.findall(r"`([a-z_]+)`", labels)))
        for section in sections
        for name, kind, labels in README_ROW.findall(section)
    }


def test_the_readme_lists_every_metric_the_processes_expose_with_its_type_and_labels(driven: Driven) -> None:
    listed = readme_metrics()
    exposed: dict[str, Family] = {}
    for process in PROCESSES:
        for name, family in families(driven.stack, process).items():
            if name.startswith(("luftpause_", "gen_ai_")):
                exposed[name] = family
    assert set(listed) == set(exposed), (
        f"in docs/operating.md only: {sorted(set(listed) - set(exposed))}; "
        f"exposed only: {sorted(set(exposed) - set(listed))}"
    )
    for name, family in exposed.items():
        kind, labels = listed[name]
        assert kind == family.type, name
        if family.sampled:
            assert labels == family.labels, (name, labels, family.labels)


def _exposed_names(stack: Stack) -> set[str]:
    """Every sample name the processes expose, and each family's name (``rate(x_total)``,
    ``x_bucket``, ``x_count``, ``x_sum``: what a query may name)."""
    names: set[str] = set()
    for process in PROCESSES:
        for family in text_string_to_metric_families(scrape_text(stack, process)):
            names.add(family.name)
            if family.type == "counter":
                names.add(f"{family.name}_total")
            if family.type == "histogram":
                names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum")}
            names |= {sample.name for sample in family.samples}
    return names


def _recorded_names() -> set[str]:
    rules = yaml.safe_load((PROMETHEUS / "recording.yml").read_text())
    return {rule["record"] for group in rules["groups"] for rule in group["rules"]}


def _rule_queries() -> list[str]:
    return [
        rule["expr"]
        for name in ("recording.yml", "alerts.yml")
        for group in yaml.safe_load((PROMETHEUS / name).read_text())["groups"]
        for rule in group["rules"]
    ]


METRIC_NAME = re.compile(
    r"\b(?:luftpause[_:][a-z0-9_:]+|gen_ai_[a-z0-9_]+|process_[a-z0-9_]+|python_[a-z0-9_]+|up(?=\{))"
)
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes of every scrape itself."""


def test_the_dashboard_and_the_rules_name_only_metrics_the_processes_expose(driven: Driven) -> None:
    known = _exposed_names(driven.stack) | _recorded_names() | PROMETHEUS_OWN
    for query in [*dashboard_queries(), *_rule_queries()]:
        named = set(METRIC_NAME.findall(query))
        assert named, query
        assert named <= known, (query, sorted(named - known))


def _prometheus_config(stack: Stack, rules: list[Path]) -> str:
    targets = {process: urllib.parse.urlsplit(metrics_url(stack, process)).netloc for process in PROCESSES}
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rules],
            "scrape_configs": [
                {"job_name": f"luftpause-{process}", "static_configs": [{"targets": [target]}]}
                for process, target in targets.items()
            ],
        }
    )


def _query(base: str, expression: str) -> dict[str, Any]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read())
    return answer


def _value(base: str, expression: str) -> float | None:
    """The value of ``expression``'s single series now, ``None`` while there is none."""
    answer = _query(base, expression)
    result = answer["data"]["result"] if answer.get("status") == "success" else []
    return float(result[0]["value"][1]) if len(result) == 1 else None


def _load(stack: Stack, seconds: float) -> int:
    """Streamed chat turns (with usage) from 6 clients under 3 callers for ``seconds``, and a turn
    for a model no replica serves now and then: the turns the new families count. Returns the
    number of finished turns."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key="unused", max_retries=0)
    deadline = time.monotonic() + seconds

    def one_client(index: int) -> int:
        done = 0
        while time.monotonic() < deadline:
            stream = client.chat.completions.create(
                model=stack.model,
                messages=[{"role": "user", "content": f"load {index} {done}"}],
                max_tokens=16,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={
                    "x-luftpause-caller": f"team-{index % 3}/job-{done}",
                    "x-luftpause-class": "batch" if index % 2 else "interactive",
                },
            )
            for _ in stream:
                pass
            done += 1
            if done % 10 == 0:
                with contextlib.suppress(openai.NotFoundError):
                    client.chat.completions.create(
                        model="no-such-model", messages=[{"role": "user", "content": "x"}]
                    )
        return done

    with ThreadPoolExecutor(6) as pool:
        return sum(pool.map(one_client, range(6)))


@pytest.mark.skipif(
    PROMETHEUS_BINARY is None, reason="prometheus not found (Debian: apt-get install prometheus)"
)
def test_a_real_prometheus_scrapes_every_process_evaluates_the_rules_and_answers_the_dashboard(
    driven: Driven, tmp_path: Path
) -> None:
    assert PROMETHEUS_BINARY is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(
        _prometheus_config(driven.stack, [PROMETHEUS / "recording.yml", PROMETHEUS / "alerts.yml"])
    )
    port = free_port()  # Prometheus cannot listen on port 0 and say where it went
    base = f"http://127.0.0.1:{port}"
    prometheus = ChildProcess(
        "prometheus",
        [
            PROMETHEUS_BINARY,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
        ready_url=f"{base}/-/ready",
        program=(),
    )
    try:
        prometheus.start().wait_ready()
        assert wait_until(lambda: _value(base, 'count(up{job=~"luftpause-.*"} == 1)') == 3, 60), (
            prometheus.log_tail()
        )
        # one series of each process
        assert (
            _value(base, 'luftpause_scheduler_replica_healthy{job="luftpause-scheduler", replica="sim-0"}')
            == 1
        )
        assert _value(base, 'luftpause_dataplane_scheduler_connected{job="luftpause-dataplane"}') == 1
        assert (
            _value(base, 'luftpause_runtime_upstream_connected{job="luftpause-runtime", server="fake"}') == 1
        )
        assert _value(base, 'sum(luftpause_runtime_runs_started_total{job="luftpause-runtime"})') == 3
        # every rule evaluated, none failing; a recording rule holds what it should
        assert wait_until(lambda: _value(base, "luftpause:scheduler_replica_healthy:sum") == 2, 60)
        assert wait_until(lambda: _value(base, "luftpause:scheduler_replica_usable:sum") == 2, 60)

        def rules() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as response:
                groups = json.loads(response.read())["data"]["groups"]
            return [rule for group in groups for rule in group["rules"]]

        assert wait_until(lambda: all(r["health"] == "ok" and r["evaluationTime"] > 0 for r in rules()), 60)
        assert len(rules()) == len(_rule_queries())
        assert all(rule["health"] == "ok" for rule in rules()), [r for r in rules() if r["health"] != "ok"]
        # under load: every new family scraped, and every query of the dashboard answered with
        # data, with Grafana's variables as they are at "All"
        finished = _load(driven.stack, 8)
        assert finished > 0
        for family in (
            "gen_ai_server_time_to_first_token_seconds_count",
            "gen_ai_server_time_per_output_token_seconds_count",
            "gen_ai_server_request_duration_seconds_count",
            "gen_ai_client_token_usage_count",
            "luftpause_dataplane_tokens_total",
            "luftpause_dataplane_turn_responses_total",
        ):
            assert wait_until(lambda f=family: (_value(base, f"sum({f})") or 0) > 0, 30), family
        assert wait_until(
            lambda: (
                _value(base, 'sum(luftpause_dataplane_turn_responses_total{code="200"})')
                == finished
                + total(driven.after["dataplane"], "luftpause_dataplane_turn_responses_total", code="200")
            ),
            30,
        )
        callers = _query(base, "sum by (caller) (luftpause_dataplane_tokens_total)")["data"]["result"]
        assert {series["metric"]["caller"] for series in callers} <= {"anonymous", "other"}
        board_variables = {"$__rate_interval": "1m", "$replica": ".*", "$job": ".*"}
        empty = []
        for query in [q for q in dashboard_queries() if not q.startswith("label_values(")]:
            for variable, value in board_variables.items():
                query = query.replace(variable, value)
            answer = _query(base, query)
            assert answer["status"] == "success", (query, answer)
            if not answer["data"]["result"]:
                empty.append(query)
        assert empty == [], empty
        with urllib.request.urlopen(f"{base}/api/v1/label/replica/values", timeout=10) as response:
            assert {"sim-0", "sim-1"} <= set(json.loads(response.read())["data"])
        assert json.loads(DASHBOARD.read_text())["templating"]["list"][2]["name"] == "replica"
    finally:
        prometheus.stop()
