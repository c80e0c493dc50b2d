"""The monitor: a page of the runtime where people watch and direct the run network (docs/architecture.md
"Pods").

Routes (added to the runtime's app by :func:`monitor_routes`)::

    GET  /monitor                      the page (luftpause/runtime/web/monitor.html), open like /health:
                                       it holds no data, its script fetches everything below
    GET  /monitor/runs[?version=V]     {"version": V', "runs": [PodOperations.network]}, every held run,
                                       oldest first; {"version": V, "unchanged": true} when the
                                       network is still at version V (the page sends the one it has)
    GET  /monitor/runs/{handle}[?since=K]
                                       {"run": describe, "messages": [conversation from K],
                                        "from", "cursor", "pendingEvents"} (PodOperations.conversation):
                                       only the messages the page does not have yet
    GET  /monitor/series[?after=SEQ]   the last 10 minutes of runs by state, one sample per 2 s
                                       (luftpause.runtime.runs.series, luftpause.observe.series), the
                                       request's tenant's runs only; after: only the samples
                                       after that seq
    POST /monitor/runs/{handle}/send   body {"message": str} -> PodOperations.send's answer
    POST /monitor/runs/{handle}/stop   -> PodOperations.stop's answer

The JSON routes take the same bearer token as ``GET /status`` (the page sends the ``?token=`` of
its own address, or one typed into the page and kept in ``sessionStorage``, as ``Authorization:
Bearer``; a cross-site form cannot set that header).

Cross-site requests (there may be no token: it is optional): every ``/monitor/runs...`` route
checks the ``Host`` header as the SDK does for ``/mcp`` when the runtime listens on a loopback
address (``127.0.0.1:*``, ``localhost:*``, ``[::1]:*``; 421 otherwise), so a DNS-rebound name
cannot read or act; and the POST routes require ``Content-Type: application/json`` (which a
cross-site page cannot send without a CORS preflight, which is never granted: 415 otherwise) and
an ``Origin`` header equal to the page's own origin (403 otherwise; a script outside a browser
sends ``Origin: http://<host:port>``). Bodies are read up to :data:`MAX_MESSAGE_BYTES` and no
further (413). Responses are JSON even for text that is not valid Unicode (lone surrogates are
written as ``\\udXXX`` escapes), so one bad string never breaks the page. A
message or stop from here acts as ``a person (monitor)``: the run's spawner is told at its next
turn (:mod:`luftpause.runtime.pods.operations`). Errors are ``{"error": {"message"}}`` with 400 (bad body,
a stopped run), 404 (unknown handle) or 410 (expired).

Cost: the version is the registry's change counter (:attr:`RunRegistry.version`, bumped on every
change to the network) prefixed by a token of this process, so a version from before a restart
never matches. The network's JSON is built at most once per version (cached; every open page
shares it) and an unchanged poll costs a comparison; a selected conversation is sent once, then
only its new messages.

The page polls ``/monitor/runs`` every second and shows the runs as a tree (parent above
children), live first and newest first within a state (the route sends them oldest first), with
state, the scope held and the first line of the last answer where a run has them, filtered in the
page by state and text (docs/pages.md); clicking a run opens its conversation in a pane that stays
in view, with a form to send it a message and a stop button. It shows a box for the token only
once a route answers 401. Data enters the DOM only as
text (never as markup), and its Content-Security-Policy allows only its own inline script and
style and requests to its own origin.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from base64 import b64encode
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from luftpause import pages
from luftpause.observe.series import SeriesRing, parse_after
from luftpause.runtime.errors import RuntimeFault
from luftpause.runtime.pods.actors import Actor
from luftpause.runtime.pods.operations import PodOperations
from luftpause.runtime.runs.series import RunSeries, for_tenant
from luftpause.runtime.runs.tenants import Tenant, tenant_in
from luftpause.runtime.web.auth import error_body

PAGE_RESOURCE = "monitor.html"
MAX_MESSAGE_BYTES = 1024 * 1024


def page_html() -> bytes:
    """The page's bytes (package data, the shared look and state vocabulary inlined:
    :mod:`luftpause.pages`); raises ``FileNotFoundError`` if installed without them."""
    return pages.assemble(resources.files(__package__).joinpath(PAGE_RESOURCE).read_bytes())


def _hashes(page: bytes, tag: bytes) -> str:
    out = []
    start = 0
    while (at := page.find(b"<" + tag + b">", start)) != -1:
        end = page.index(b"</" + tag + b">", at)
        body = page[at + len(tag) + 2 : end]
        out.append("'sha256-" + b64encode(hashlib.sha256(body).digest()).decode() + "'")
        start = end
    return " ".join(out)


def page_csp(page: bytes) -> str:
    """The page's Content-Security-Policy: its own inline script and style by hash, fetches to
    its own origin, nothing else."""
    return (
        f"default-src 'none'; script-src {_hashes(page, b'script')}; style-src {_hashes(page, b'style')}; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Hosts the monitor answers for when the runtime listens on loopback (as the SDK's ``/mcp``)."""


class Refused(Exception):
    """A request the monitor refuses before acting: ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(data: Any, status: int = 200) -> Response:
    try:
        body = orjson.dumps(data)
    except TypeError:  # text that is not valid Unicode (a lone surrogate): escaped, not a 500
        body = json.dumps(data, ensure_ascii=True, default=str).encode()
    return Response(body, status_code=status, media_type="application/json")


def host_allowed(host: str | None, listen_host: str | None) -> bool:
    """Whether a request's ``Host`` header may reach the monitor: any, unless the runtime
    listens on a loopback address (``listen_host``), then only ``127.0.0.1``, ``localhost`` or
    ``[::1]`` with any port, as the SDK's transport security allows for ``/mcp``."""
    if listen_host is None or listen_host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        return True
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name in LOOPBACK_HOSTS


def _check_post(request: Request) -> None:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise Refused(415, "expected Content-Type: application/json")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin is None or origin != own:
        raise Refused(403, f"expected Origin: {own} (the monitor's own origin), got {origin!r}")


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, read until ``limit`` bytes at most (raises :class:`Refused` 413 past it)."""
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > limit:
            raise Refused(413, f"the body is over {limit} bytes")
    return bytes(chunks)


def _fault(exc: RuntimeFault) -> Response:
    status = exc.status if exc.status in (400, 403, 404, 410) else 400
    return Response(error_body(str(exc)), status_code=status, media_type="application/json")


MAX_CACHED_TENANTS = 64
"""Tenants whose network JSON the monitor keeps built at once (cleared past it)."""


def monitor_routes(
    pods: PodOperations, listen_host: str | None = None, series: RunSeries | None = None
) -> list[Route]:
    """The monitor's routes over the runtime's pod operations and its ``series`` (none: a ring that
    is never sampled, so ``/monitor/series`` answers no samples); ``listen_host`` the address the
    runtime listens on (loopback: the ``Host`` check, :func:`host_allowed`)."""
    ring = series.ring if series is not None else SeriesRing()
    page = page_html()
    csp = page_csp(page)

    async def monitor_page(request: Request) -> Response:
        return Response(
            page,
            media_type="text/html; charset=utf-8",
            headers={"Content-Security-Policy": csp, "Cache-Control": "no-store"},
        )

    def guarded(body: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if not host_allowed(request.headers.get("host"), listen_host):
                    raise Refused(421, f"Host {request.headers.get('host')!r} is not served here")
                if request.method == "POST":
                    _check_post(request)
                answer = await body(request)
                return answer if isinstance(answer, Response) else _json(answer)
            except Refused as exc:
                return Response(error_body(str(exc)), status_code=exc.status, media_type="application/json")
            except RuntimeFault as exc:
                return _fault(exc)
            except ValueError as exc:
                return Response(error_body(str(exc)), status_code=400, media_type="application/json")

        return endpoint

    boot = secrets.token_hex(4)
    built: dict[Tenant | None, tuple[str, bytes]] = {}  # per tenant: (version, its network's JSON)

    def network_json(tenant: Tenant | None) -> tuple[str, bytes]:
        version = f"{boot}.{pods.registry.version}"
        cached = built.get(tenant)
        if cached is None or cached[0] != version:
            if len(built) > MAX_CACHED_TENANTS:
                built.clear()
            body = bytes(_json({"version": version, "runs": pods.network(tenant)}).body)
            cached = built[tenant] = (version, body)
        return cached

    async def runs(request: Request) -> Any:
        version, body = network_json(tenant_in(request.scope))
        if request.query_params.get("version") == version:
            return {"version": version, "unchanged": True}
        return Response(body, media_type="application/json")

    async def conversation(request: Request) -> dict[str, Any]:
        since = request.query_params.get("since")
        if since is not None and not since.isdigit():
            raise ValueError(f"since: expected a message index (0 or more), got {since!r}")
        at = int(since) if since is not None else None
        return pods.conversation(request.path_params["handle"], at, tenant_in(request.scope))

    async def recent(request: Request) -> dict[str, Any]:
        return for_tenant(
            ring.since(parse_after(request.query_params.get("after"))), tenant_in(request.scope)
        )

    async def send(request: Request) -> dict[str, Any]:
        raw = await _read_body(request, MAX_MESSAGE_BYTES)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON body {{'message': text}}: {exc}") from None
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message.strip():
            raise ValueError("expected a JSON body {'message': non-empty text}")
        sent = pods.send(Actor.person(tenant_in(request.scope)), request.path_params["handle"], message)
        await pods.registry.durable()  # as the MCP tools do: answered, it survives a kill
        return sent

    async def stop(request: Request) -> dict[str, Any]:
        stopped = pods.stop(Actor.person(tenant_in(request.scope)), request.path_params["handle"])
        await pods.registry.durable()
        return stopped

    return [
        Route("/monitor", monitor_page, methods=["GET"]),
        Route("/monitor/runs", guarded(runs), methods=["GET"]),
        Route("/monitor/series", guarded(recent), methods=["GET"]),
        Route("/monitor/runs/{handle}", guarded(conversation), methods=["GET"]),
        Route("/monitor/runs/{handle}/send", guarded(send), methods=["POST"]),
        Route("/monitor/runs/{handle}/stop", guarded(stop), methods=["POST"]),
    ]
