"""The scheduler's HTTP side: ``GET /status`` (the core's snapshot as JSON), ``GET /`` (the live
page), ``GET /series[?after=SEQ]`` (the last 10 minutes as samples), ``GET /metrics`` (Prometheus
text, :mod:`luftpause.scheduler.metrics`), ``GET /livez`` and ``GET /readyz``
(:mod:`luftpause.serving.health`: ready once the first probe round of every replica is in, so that no
dataplane is told every replica is healthy before one was seen), and ``GET /health``
(``{"status": "ok"}`` while the process serves, as before ``/livez`` existed).

The JSON shapes are documented in :mod:`luftpause.scheduler.core.snapshot` and
:mod:`luftpause.scheduler.series` (with :mod:`luftpause.observe.series`); ``/series`` is guarded like
``/status`` (it names no caller, but it is data: whatever check ``/status`` gets, it gets). A bad
``after`` is 400. The live page is ``page.html`` beside this module (package data): one
self-contained HTML file, no external assets, whose script polls ``status`` and ``series`` every
2 s (drawing the series as inline SVG) and, with ``?runtime=URL`` (and ``?token=``), also that
runtime's ``GET /status`` run tree. It puts data in the DOM only as text; its answer carries a
Content-Security-Policy that runs only its own inline script (by hash), so markup that got into the
DOM anyway could not run. Every error is answered with the JSON error body of the failure
contract (docs/architecture.md "Failure contract"), ``{"error": {"message": "..."}}``, and the
status of its class in :mod:`luftpause.scheduler.errors`: an unknown path 404, a known path with
another method 405 (with ``Allow``), a fault of ours 500.

Access (:mod:`luftpause.auth`), checked before routing:

* ``/health``, ``/livez``, ``/readyz`` and ``/metrics`` are open (:data:`OPEN_PATHS`: probes
  carry no token and may name the pod by any address; the metrics name no caller);
* every other path is answered only for a ``Host`` on the allow-list
  (:class:`~luftpause.auth.hosts.HostAllowList`; 421 otherwise), so a DNS-rebinding page cannot
  read ``/status``, which names callers, nor drive the admin API;
* with ``LUFTPAUSE_TOKEN`` set, every other path but the page ``/`` (``/status``, ``/series``,
  the admin API) needs ``Authorization: Bearer <token>`` (401 with ``WWW-Authenticate``
  otherwise). The page itself holds no data and stays open, like the runtime's monitor: its script
  takes the token from the page's own ``?token=`` (then keeps it in ``sessionStorage`` for the tab
  and takes it out of the address bar) and sends it with every poll of ``status``, ``series`` and
  ``?runtime=``;
* a request with a body (the admin API's) that has not been answered ``body_timeout_s`` after it
  came is answered 408 (:func:`luftpause.serving.listeners.aiohttp_deadline`).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from importlib import resources
from typing import Any

import orjson
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from luftpause import pages
from luftpause.auth.hosts import HostAllowList
from luftpause.auth.tokens import CHALLENGE, REFUSED, bearer_matches
from luftpause.config import ListenerLimits
from luftpause.observe import metrics
from luftpause.observe.series import parse_after
from luftpause.scheduler.errors import MethodNotAllowed, RouteNotFound, SchedulerError
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.metrics import SchedulerMetrics
from luftpause.serving import health as probes
from luftpause.serving.listeners import aiohttp_deadline

log = logging.getLogger("luftpause.scheduler")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error answer: ``status`` with body ``{"error": {"message": message}}``."""
    return web.Response(
        status=status,
        body=orjson.dumps({"error": {"message": message}}),
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer aiohttp's 404/405 and any unexpected exception with the JSON error body."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        refused = MethodNotAllowed(request.method, request.path, list(exc.allowed_methods))
        return error_response(refused.http_status, str(refused), {hdrs.ALLOW: refused.allow})
    except web.HTTPNotFound:
        missing = RouteNotFound(request.method, request.path)
        return error_response(missing.http_status, str(missing))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        return error_response(exc.status, exc.reason)
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(SchedulerError.http_status, f"internal error: {type(exc).__name__}")


OPEN_PATHS = frozenset({"/health", "/livez", "/readyz", "/metrics"})
"""Paths served to anyone: no token, no ``Host`` check. Probes carry no token and name the pod by
any address; ``/metrics`` holds counts and names no caller (Prometheus scrapes it, as the
dataplane's)."""
PAGE_PATH = "/"
"""The page: ``Host``-checked, but no token (it holds no data; its script sends the token)."""


def access_middleware(token: str | None, hosts: HostAllowList) -> Any:
    """aiohttp middleware: the ``Host`` check and the token of the module docstring."""
    expected = token.encode() if token else None

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in OPEN_PATHS:
            return await handler(request)
        host = request.headers.get(hdrs.HOST)
        if not hosts.allows(host):
            return error_response(421, hosts.refusal(host))
        if (
            expected is not None
            and path != PAGE_PATH
            and not bearer_matches(request.headers.get(hdrs.AUTHORIZATION), expected)
        ):
            return error_response(401, REFUSED, {hdrs.WWW_AUTHENTICATE: CHALLENGE})
        return await handler(request)

    return access


PAGE_RESOURCE = "page.html"

_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


def page_html() -> bytes:
    """The live page, ``luftpause/scheduler/page.html`` with the shared look and state vocabulary
    inlined (:mod:`luftpause.pages`), as UTF-8 bytes.

    Raises ``FileNotFoundError`` when the package was installed without its data file.
    """
    return pages.assemble(resources.files(__package__).joinpath(PAGE_RESOURCE).read_bytes())


def page_csp(page: bytes) -> str:
    """A Content-Security-Policy for ``page`` (CSP Level 3): its inline ``<script>`` and ``<style>``
    blocks allowed by SHA-256 hash, nothing else loaded or run; ``connect-src *`` because the page
    fetches ``/status`` here and, with ``?runtime=``, a runtime elsewhere."""
    none = "'none'"
    hashes: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for kind, body in _INLINE.findall(page):
        hashes[kind].append(f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'")
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src {' '.join(hashes[b'script']) or none}",
            f"style-src {' '.join(hashes[b'style']) or none}",
            "connect-src *",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


def readiness(host: SchedulerHost) -> dict[str, probes.Check]:
    """``/readyz``'s checks: ``probed``, the first probe round is in."""
    rounds = host.counts.probe_rounds
    return {
        "probed": probes.Check(
            host.probed, f"{rounds} probe rounds of the replicas" if rounds else "no probe round yet"
        )
    }


def status_app(
    host: SchedulerHost,
    token: str | None = None,
    hosts: HostAllowList | None = None,
    limits: ListenerLimits | None = None,
) -> web.Application:
    """An aiohttp application serving ``/`` (the live page), ``/status``, ``/series``, ``/metrics``,
    ``/livez``, ``/readyz``, ``/health`` and the admin API (:mod:`.admin_http`) from ``host``;
    ``token`` (``LUFTPAUSE_TOKEN``, ``None``: none), ``hosts`` (default: loopback and this
    machine's names) and ``limits`` (the body deadline; default ``[scheduler.limits]``'s defaults)
    as the module docstring says.

    Raises ``FileNotFoundError`` when ``page.html`` is missing from the installed package.
    """
    from luftpause.scheduler.admin_http import add_admin_routes  # it imports error_response from here

    page = page_html()
    page_headers = {
        hdrs.CONTENT_SECURITY_POLICY: page_csp(page),
        hdrs.CACHE_CONTROL: "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",  # ?token= must not leave in a Referer
    }

    async def live_page(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=page_headers)

    async def status(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(host.status()), content_type="application/json")

    async def series(request: web.Request) -> web.Response:
        try:
            after = parse_after(request.query.get("after"))
        except ValueError as exc:
            return error_response(400, str(exc))
        return web.Response(body=orjson.dumps(host.recent(after)), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    def probe_answer(answer: tuple[int, bytes]) -> web.Response:
        code, body = answer
        return web.Response(status=code, body=body, content_type=probes.CONTENT_TYPE)

    async def livez(request: web.Request) -> web.Response:
        return probe_answer(probes.LIVE)

    async def readyz(request: web.Request) -> web.Response:
        return probe_answer(probes.report(readiness(host)))

    registry = metrics.new_registry([SchedulerMetrics(host)])

    async def exposition(request: web.Request) -> web.Response:
        return web.Response(
            body=metrics.exposition(registry), headers={hdrs.CONTENT_TYPE: metrics.CONTENT_TYPE}
        )

    hosts = hosts if hosts is not None else HostAllowList("127.0.0.1")
    deadline = aiohttp_deadline(limits if limits is not None else ListenerLimits())
    app = web.Application(middlewares=[json_errors, access_middleware(token, hosts), deadline])
    app.router.add_get("/", live_page)
    app.router.add_get("/status", status)
    app.router.add_get("/series", series)
    app.router.add_get("/metrics", exposition)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/health", health)
    add_admin_routes(app, host)  # /admin/replicas (luftpause.scheduler.admin_http)
    return app
