"""The operator files of ``deploy/`` that two kinds of test read: the Prometheus rules and the
Grafana dashboard, checked offline (``tooling/test_prometheus_rules_and_dashboard.py``) and
evaluated against a real stack (``stack/test_metrics_scraped_by_prometheus.py``)."""

from __future__ import annotations

import json

from repo_paths import ROOT

PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "luftpause.json"


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    board = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries
