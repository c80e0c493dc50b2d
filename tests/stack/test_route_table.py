"""The route table of docs/operating.md ("Security", "Every route") is what the processes do: every row walked
against a real stack with ``LUFTPAUSE_TOKEN`` set, without the token, with it, and with a foreign
``Host``; and every route the processes declare has a row (a route added without one fails here).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from grpc_helpers import connect_once
from repo_paths import ROOT

from luftpause.config import load_config
from luftpause.dataplane.wiring import build_dataplane
from luftpause.runtime.server import create_app as runtime_app
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.status_http import status_app
from luftpause.testkit.launch.stack import Stack
from luftpause.v1 import scheduler_pb2 as pb

DOC = ROOT / "docs" / "operating.md"
MARKER = "<!-- route table: tests/stack/test_route_table.py"
TOKEN = "route-table-token"
FOREIGN = "evil.example"
SAMPLES = {"{id}": "route-table-run", "{handle}": "run-0000000000000000", "{name}": "route-table-replica"}


@dataclass(frozen=True)
class Row:
    process: str
    method: str  # "gRPC" for the link
    path: str
    needs: str
    host_checked: bool

    @property
    def needs_token(self) -> bool:
        return self.needs.startswith("token")

    def url_path(self) -> str:
        path = self.path
        for placeholder, sample in SAMPLES.items():
            path = path.replace(placeholder, sample)
        return path


def route_table() -> list[Row]:
    """The rows of the route table in docs/operating.md."""
    text = DOC.read_text()
    assert MARKER in text, "docs/operating.md has no route table marker"
    lines = text[text.index(MARKER) :].splitlines()[1:]
    rows = []
    started = False
    for line in lines:
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] in ("process", "---"):
            continue
        process, route, needs, host = cells
        match = re.fullmatch(r"(?:gRPC )?`(?:(GET|POST|DELETE|PUT) )?([^`]+)`", route)
        assert match, f"a route the test cannot read: {route!r}"
        method = match.group(1) or "gRPC"
        rows.append(Row(process, method, match.group(2), needs, host in ("yes", "on loopback")))
    assert rows
    return rows


ROWS = route_table()


# --- every route the processes declare is in the table ---------------------------------------


def _declared_scheduler() -> set[tuple[str, str]]:
    config = load_config()
    app = status_app(SchedulerHost(config))
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def _declared_runtime(tmp_path: Path) -> set[tuple[str, str]]:
    config = load_config()
    config = config.model_copy(
        update={"runtime": config.runtime.model_copy(update={"state_dir": str(tmp_path)})}
    )
    declared = set()
    for route in runtime_app(config).routes:
        path = getattr(route, "path", None)
        methods = getattr(route, "methods", None) or {"GET", "POST", "DELETE"}  # the SDK's /mcp
        for method in methods:
            if method != "HEAD" and path is not None:
                declared.add((method, path))
    return declared


def _declared_dataplane() -> set[tuple[str, str]]:
    # The dataplane's route table (Dataplane.routes), as the app is built.
    return {
        (method, route.path)
        for route in build_dataplane(load_config()).routes
        for method in route.methods
        if method != "HEAD"
    }


def test_every_declared_route_has_a_row(tmp_path: Path) -> None:
    documented = {(row.process, row.method, row.path) for row in ROWS}
    declared = (
        {("scheduler", m, p) for m, p in _declared_scheduler()}
        | {("runtime", m, p) for m, p in _declared_runtime(tmp_path)}
        | {("dataplane", m, p) for m, p in _declared_dataplane()}
        | {
            ("scheduler", "gRPC", f"{service.full_name}/{method.name}")
            for service in pb.DESCRIPTOR.services_by_name.values()
            for method in service.methods
        }
    )
    assert declared - documented == set(), "routes with no row in the route table of docs/operating.md"
    assert documented - declared == set(), "rows of the route table of docs/operating.md no process declares"


# --- every row against a real stack ------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack.start(tmp_path_factory.mktemp("route-table"), env={"LUFTPAUSE_TOKEN": TOKEN}) as started:
        started.wait_connected()
        yield started


def _base(stack: Stack, process: str) -> str:
    return {
        "scheduler": stack.status_url.removesuffix("/status"),
        "dataplane": stack.dataplane_url,
        "runtime": stack.runtime_url.removesuffix("/mcp"),
    }[process]


def _request(stack: Stack, row: Row, token: bool, host: str | None = None) -> httpx.Response:
    headers = {"accept": "application/json, text/event-stream"}
    if token:
        headers["authorization"] = f"Bearer {TOKEN}"
    if host is not None:
        headers["host"] = host
    return httpx.request(
        row.method, f"{_base(stack, row.process)}{row.url_path()}", headers=headers, timeout=30
    )


def _json_error(response: httpx.Response) -> str:
    message = response.json()["error"]["message"]
    assert isinstance(message, str) and message
    return message


HTTP_ROWS = [row for row in ROWS if row.method != "gRPC"]


@pytest.mark.integration
@pytest.mark.parametrize("row", HTTP_ROWS, ids=[f"{r.process} {r.method} {r.path}" for r in HTTP_ROWS])
def test_each_route_needs_what_its_row_says(stack: Stack, row: Row) -> None:
    without = _request(stack, row, token=False)
    if row.needs_token:
        assert without.status_code == 401, without.text
        _json_error(without)
        assert without.headers["www-authenticate"] == 'Bearer realm="luftpause"'
        assert _request(stack, row, token=True).status_code != 401
    else:
        assert without.status_code not in (401, 421), without.text
    foreign = _request(stack, row, token=True, host=FOREIGN)
    if row.host_checked:
        assert foreign.status_code == 421, foreign.text
        _json_error(foreign)
    else:
        assert foreign.status_code not in (401, 421), foreign.text


@pytest.mark.integration
def test_the_grpc_rows_need_what_they_say(stack: Stack) -> None:
    for row in (r for r in ROWS if r.method == "gRPC"):
        assert row.needs.startswith("token")
        assert connect_once(stack.scheduler_grpc, None, "route-table") == "UNAUTHENTICATED"
        bearer = (("authorization", f"Bearer {TOKEN}"),)
        assert connect_once(stack.scheduler_grpc, bearer, "route-table") == "resynced"
