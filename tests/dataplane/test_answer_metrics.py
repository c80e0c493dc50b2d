"""The dataplane's figures of finished turns (:mod:`luftpause.dataplane.observe.answer_metrics`) and the
usage per caller folded from them (:mod:`luftpause.dataplane.observe.usage`), without a network: what a
turn adds, which callers get a series, how windows roll, and that ``promtool check metrics``
accepts the exposition. Counted from real turns through a real dataplane:
``tests/dataplane/test_chat_route_headers_and_routes.py`` and ``tests/stack/test_caller_usage.py``;
scraped by a real Prometheus: ``tests/stack/test_metrics_scraped_by_prometheus.py``."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from luftpause.dataplane.observe.metrics import DataplaneMetrics, Gauges
from luftpause.dataplane.observe.usage import CallerLabels
from luftpause.v1 import scheduler_pb2 as pb

PROMTOOL = shutil.which("promtool")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def samples(metrics: DataplaneMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }


def test_a_caller_is_counted_under_its_configured_root_else_anonymous_or_other() -> None:
    labels = CallerLabels(["team-a", "team-b/ci"])  # a configured sub-caller counts for its root
    assert labels("team-a") == "team-a"
    assert labels("team-a/job-7/step-2") == "team-a"
    assert labels("team-b") == "team-b"
    assert labels("") == "anonymous"
    assert labels("mallory-1") == labels("mallory-2/x") == "other"
    assert labels.names == ["team-a", "team-b", "anonymous", "other"]


def test_a_finished_turn_adds_its_times_and_tokens_under_bounded_labels() -> None:
    metrics = DataplaneMetrics(replicas=["sim-0"], callers=["team-a"])
    answers = metrics.answers
    # streamed: arrived at 10.0, first token at 10.5, end at 12.5 with 21 output tokens
    answers.finished("m", "sim-0", pb.INTERACTIVE, "team-a/job-1", 10.0, 10.5, 12.5, 100, 21, 60)
    # whole (no first token), tokens not reported
    answers.finished("m", "sim-0", pb.BATCH, "someone", 0.0, None, 3.0, -1, -1, -1)
    answers.responded(200)
    answers.responded(200)
    answers.responded(499)
    found = samples(metrics)
    team = (("caller", "team-a"), ("model", "m"), ("replica", "sim-0"), ("service_class", "interactive"))
    other = (("caller", "other"), ("model", "m"), ("replica", "sim-0"), ("service_class", "batch"))
    assert found[("gen_ai_server_time_to_first_token_seconds_sum", team)] == 0.5
    assert found[("gen_ai_server_time_per_output_token_seconds_sum", team)] == 0.1  # 2.0 s / 20
    assert found[("gen_ai_server_request_duration_seconds_sum", team)] == 2.5
    assert found[("gen_ai_server_request_duration_seconds_sum", other)] == 3.0
    assert found[("gen_ai_server_time_to_first_token_seconds_count", other)] == 0  # whole answer
    usage = "gen_ai_client_token_usage"
    assert found[(f"{usage}_sum", tuple(sorted((*team, ("gen_ai_token_type", "input")))))] == 100
    assert found[(f"{usage}_count", tuple(sorted((*other, ("gen_ai_token_type", "output")))))] == 0
    token = "luftpause_dataplane_tokens_total"
    assert found[(token, tuple(sorted((*team, ("type", "prompt")))))] == 100
    assert found[(token, tuple(sorted((*team, ("type", "completion")))))] == 21
    assert found[(token, tuple(sorted((*team, ("type", "cached_prompt")))))] == 60
    assert found[(token, tuple(sorted((*other, ("type", "prompt")))))] == 0  # not reported: nothing
    codes = "luftpause_dataplane_turn_responses_total"
    assert found[(codes, (("code", "200"),))] == 2 and found[(codes, (("code", "499"),))] == 1


def test_usage_per_caller_and_model_over_the_life_and_per_window() -> None:
    clock = Clock(7200.0 + 10)  # 10 s into a window of 3600
    metrics = DataplaneMetrics(callers=["team-a"], usage_window_s=3600, wall_clock=clock)
    add = metrics.answers.finished
    add("m", "r", pb.INTERACTIVE, "team-a/x", 0, 0.1, 1, 10, 5, 4)
    add("m", "r2", pb.BATCH, "team-a", 0, 0.1, 1, 20, 6, 0)  # another replica and class: one row
    first = metrics.answers.usage.report()
    row = {"caller": "team-a", "model": "m", "promptTokens": 30, "completionTokens": 11,
           "cachedPromptTokens": 4, "turns": 2}  # fmt: skip
    assert first["life"] == [row] and first["current"]["usage"] == [row]
    assert first["current"]["start"] == 7200 and first["previous"]["usage"] == []
    clock.now = 10_800.0 + 5  # the next window
    add("n", "r", pb.INTERACTIVE, "", 0, 0.1, 1, 1, 1, -1)
    second = metrics.answers.usage.report()
    assert second["previous"] == {"start": 7200, "end": 10_800, "usage": [row]}
    anonymous = {"caller": "anonymous", "model": "n", "promptTokens": 1, "completionTokens": 1,
                 "cachedPromptTokens": 0, "turns": 1}  # fmt: skip
    assert second["current"]["usage"] == [anonymous]
    assert second["life"] == [anonymous, row]
    clock.now = 10 * 3600.0  # windows with no turn in between: both are empty
    third = metrics.answers.usage.report()
    assert third["current"]["usage"] == [] and third["previous"]["usage"] == []
    assert third["life"] == second["life"]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not found (Debian: apt-get install prometheus)")
def test_promtool_check_metrics_accepts_the_dataplanes_exposition() -> None:
    assert PROMTOOL is not None
    metrics = DataplaneMetrics(replicas=["sim-0"], callers=["team-a"])
    metrics.turn_ended("finished", pb.INTERACTIVE, "sim-0")
    metrics.answers.finished("m", "sim-0", pb.INTERACTIVE, "team-a", 0, 0.1, 1, 10, 5, 4)
    metrics.answers.responded(200)
    text = metrics.exposition(Gauges(in_flight=1, connected=True, healthy_replicas=2))
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
