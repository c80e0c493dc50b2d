"""The scheduler page's tests in headless Chromium: load a page, let its script run, read the DOM
Chromium dumps (:func:`dump_dom`, :class:`Element`); serve a page and canned answers from small
local servers (:func:`routes_servers`, :class:`RoutesServer`). Chromium must be installed
(``/usr/bin/chromium``): without it a test fails, it is never skipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from luftpause.scheduler.status_http import page_html
from luftpause.testkit.launch.procs import free_port

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
DUMP_TIMEOUT_S = 90.0  # a fail-safe against a hung browser, never a measured bound
DASH = "\N{EN DASH}"  # what the page shows for a missing value


# A streamed completion read to its end, with a caller and a service class (and a bearer token,
# when a sixth argument gives one); exits when killed.
STREAM_CLIENT = """
import sys, urllib.request
url, body, run, caller, service_class = sys.argv[1:6]
headers = {"content-type": "application/json", "x-luftpause-run-id": run,
    "x-luftpause-caller": caller, "x-luftpause-class": service_class}
if len(sys.argv) > 6 and sys.argv[6]:
    headers["authorization"] = "Bearer " + sys.argv[6]
request = urllib.request.Request(url, data=body.encode(), method="POST", headers=headers)
with urllib.request.urlopen(request, timeout=600) as response:
    while response.read(4096):
        pass
"""


# -- Chromium and the dumped DOM ---------------------------------------------------------------------


def chromium() -> str:
    """The Chromium binary; fails the test (never skips) when it is not installed."""
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        pytest.fail("chromium is not installed (Debian: apt-get install chromium; `make` installs it in CI)")
    return found


def run_chromium(args: list[str]) -> str:
    """Run headless Chromium with a throwaway profile; its stdout. Its whole process group is
    killed if it outlives :data:`DUMP_TIMEOUT_S`."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        process = subprocess.Popen(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=DUMP_TIMEOUT_S)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        assert process.returncode == 0, (
            f"chromium exited {process.returncode}: {err.decode(errors='replace')}"
        )
        return out.decode()


def dump_dom(url: str, budget_ms: int = 3000) -> Element:
    """Load ``url``, let its script run ``budget_ms`` of virtual time (network waits do not count),
    and parse the DOM Chromium dumps."""
    return parse(run_chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url]))


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Element]:
        """Descendants with this ``tag`` (any, if None) whose attributes have these values
        (``data_caller="x"`` matches ``data-caller="x"``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            e
            for e in list(self.iter())[1:]
            if (tag is None or e.tag == tag) and all(e.attrs.get(k) == v for k, v in wanted.items())
        ]

    def one(self, tag: str | None = None, **attrs: str) -> Element:
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, f"expected one <{tag} {attrs}>, found {len(found)}"
        return found[0]

    def cell(self, cls: str) -> str:
        """Text of the single descendant whose class list holds ``cls``."""
        found = [e for e in self.iter() if cls in e.attrs.get("class", "").split()]
        assert len(found) == 1, f"expected one .{cls} in {self.text()!r}, found {len(found)}"
        return " ".join(found[0].text().split())


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def by_id(dom: Element, element_id: str) -> Element:
    return dom.one(id=element_id)


def poll_state(dom: Element) -> str:
    return by_id(dom, "poll").attrs["data-state"]


# -- small local servers: a page and canned answers ---------------------------------------------------


class Routes(BaseHTTPRequestHandler):
    """Answers ``GET`` from the server's ``routes``: path -> ``(status, content_type, body)``, or a
    callable taking the request's headers. CORS as the runtime answers it."""

    server: RoutesServer

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.partition("?")[0])
        if route is None:
            status, content_type, body = 404, "application/json", b'{"error":{"message":"no route"}}'
        elif callable(route):
            status, content_type, body = route(dict(self.headers))
        else:
            status, content_type, body = route
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


Route = tuple[int, str, bytes] | Callable[[dict[str, str]], tuple[int, str, bytes]]


class RoutesServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, routes: dict[str, Route]) -> None:
        super().__init__(("127.0.0.1", free_port()), Routes)
        self.routes = routes

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def routes_servers() -> Iterator[Callable[[dict[str, Route]], RoutesServer]]:
    """A function that starts a :class:`RoutesServer` on a free port in a thread of its own; every
    server it started is shut down when the block ends (a test's ``serve`` fixture wraps this)."""
    servers: list[tuple[RoutesServer, threading.Thread]] = []

    def start(routes: dict[str, Route]) -> RoutesServer:
        server = RoutesServer(routes)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return server

    try:
        yield start
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join()


def json_route(data: Any) -> tuple[int, str, bytes]:
    """A route answering 200 with ``data`` as JSON."""
    return 200, "application/json", json.dumps(data).encode()


PAGE_ROUTE = (200, "text/html; charset=utf-8", page_html())
"""A route answering the scheduler's page, as ``GET /`` serves it (less its headers)."""


EMPTY_STATUS: dict[str, Any] = {  # a scheduler with nothing in it, in /status's shape (older: no "limits")
    "replicas": [],
    "held": {"count": 0, "by_class": {}, "by_caller": {}, "oldest_wait_s": 0.0},
    "runs": {},
    "runs_by_class": {},
    "counters": {},
    "lost_dataplanes": {},
}
