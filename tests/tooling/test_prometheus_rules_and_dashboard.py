"""The Prometheus rules and the Grafana dashboard of ``deploy/`` are well formed.

``promtool`` (Debian's ``prometheus`` package ships it) checks the rule files and the example
scrape configuration, and runs the rules' unit test (``deploy/prometheus/tests/alerts_test.yml``:
an alert firing after its ``for``, a recording rule's value). Where promtool is absent those tests
are skipped, saying why. That the rules and the dashboard's queries name only metrics the
processes expose, and evaluate against a real stack, is ``tests/stack/test_metrics_scraped_by_prometheus.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import DASHBOARD, PROMETHEUS, dashboard_queries

PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found (Debian: apt-get install prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_accepts_the_rule_files_and_the_scrape_configuration() -> None:
    rules = promtool("check", "rules", "recording.yml", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_the_rules_unit_test_passes() -> None:
    result = promtool("test", "rules", "tests/alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def _promtool_test_with(tmp_path: Path, old: str, new: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the unit test over alerts.yml with ``old`` replaced by ``new``."""
    for name in ("alerts.yml", "recording.yml"):
        text = (PROMETHEUS / name).read_text()
        if name == "alerts.yml":
            assert old in text
            text = text.replace(old, new)
        (tmp_path / name).write_text(text)
    (tmp_path / "tests").mkdir()
    shutil.copy(PROMETHEUS / "tests" / "alerts_test.yml", tmp_path / "tests")
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "test", "rules", "tests/alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


_NO_USABLE = "expr: luftpause:scheduler_replica_usable:sum == 0\n        for: 1m"


@needs_promtool
def test_the_rules_unit_test_can_fail(tmp_path: Path) -> None:
    """The unit test is not one that passes whatever the rules say: without the alert's ``for``
    it fires at 1 min 30 s, where the test expects it pending, and promtool says so."""
    result = _promtool_test_with(tmp_path, _NO_USABLE, _NO_USABLE.replace("for: 1m", "for: 0s"))
    assert result.returncode != 0
    assert "LuftpauseNoHealthyReplica" in result.stdout + result.stderr


@needs_promtool
def test_the_unit_test_catches_the_alert_that_counted_healthy_replicas_only(tmp_path: Path) -> None:
    """The expression the alert had (healthy replicas summed) stays at 2 while one replica is
    drained and the other's breaker is open: the unit test's case for that outage fails on it."""
    old = "expr: sum without (replica) (luftpause_scheduler_replica_healthy) == 0\n        for: 1m"
    result = _promtool_test_with(tmp_path, _NO_USABLE, old)
    assert result.returncode != 0
    assert "alertname: LuftpauseNoHealthyReplica, time: 2m30s" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test_case_where_it_fires_and_one_where_it_does_not_yet() -> None:
    """Each alert of alerts.yml is expected to fire in some case of the unit test (the outage it is
    for) and expected silent at an earlier time (before its ``for``, or in the state next to the
    outage): an alert nobody tested cannot be trusted to fire."""
    cases = yaml.safe_load((PROMETHEUS / "tests" / "alerts_test.yml").read_text())["tests"]
    firing, silent = set(), set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    assert alerts - firing == set(), "never expected to fire"
    assert alerts - {"LuftpauseReplicaTurnFailures"} - silent == set(), "never expected silent"


def test_no_usable_replica_counts_drained_and_breaker_open_replicas() -> None:
    """The alert for "every new turn is held" reads the usable count (healthy, not draining,
    breaker closed), not the healthy count, which stayed at 2 while neither replica was usable."""
    rule = next(rule for rule in _rules() if rule.get("alert") == "LuftpauseNoHealthyReplica")
    assert rule["expr"].strip() == "luftpause:scheduler_replica_usable:sum == 0"
    usable = next(r for r in _rules() if r.get("record") == "luftpause:scheduler_replica_usable:sum")
    for family in ("healthy", "draining", "breaker_open"):
        assert f"luftpause_scheduler_replica_{family}" in usable["expr"]


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for name in ("recording.yml", "alerts.yml")
        for group in yaml.safe_load((PROMETHEUS / name).read_text())["groups"]
        for rule in group["rules"]
    ]


def test_recording_rules_follow_the_level_metric_operations_naming() -> None:
    """Prometheus "Recording rules": ``level:metric:operations``, here ``luftpause:...:...``."""
    for rule in _rules():
        if "record" in rule:
            level, metric, operations = rule["record"].split(":")
            assert level == "luftpause" and metric and operations is not None, rule["record"]


def test_every_alert_has_a_severity_a_summary_and_a_for() -> None:
    alerts = [rule for rule in _rules() if "alert" in rule]
    assert len(alerts) >= 5
    for alert in alerts:
        assert alert["alert"].startswith("Luftpause"), alert
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert
        assert alert["annotations"]["summary"], alert
        assert alert["for"], alert


def test_the_dashboard_is_one_grafana_dashboard_with_a_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "luftpause" and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"], panel["title"]
    # every process has panels
    text = " ".join(dashboard_queries())
    for process in ("scheduler", "dataplane", "runtime"):
        assert f"luftpause_{process}_" in text, process
