"""The monitor: a page of the runtime where people watch and direct the run network (DESIGN.md
"Pods").

Routes (added to the runtime's app by :func:`monitor_routes`)::

    GET  /monitor                      the page (luftpause/runtime/monitor.html), open like /health:
                                       it holds no data, its script fetches everything below
    GET  /monitor/runs                 {"runs": [Pods.describe]}, every held run, oldest first
    GET  /monitor/runs/{handle}        {"run": describe, "messages": [conversation], "pendingEvents"}
    POST /monitor/runs/{handle}/send   body {"message": str} -> Pods.send's answer
    POST /monitor/runs/{handle}/stop   -> Pods.stop's answer

The JSON routes take the same bearer token as ``GET /status`` (the page sends the ``?token=`` of
its own address as ``Authorization: Bearer``; a cross-site form cannot set that header). A
message or stop from here acts as ``a person (monitor)``: the run's spawner is told at its next
turn (:mod:`luftpause.runtime.pods`). Errors are ``{"error": {"message"}}`` with 400 (bad body,
a stopped run), 404 (unknown handle) or 410 (expired).

The page polls ``/monitor/runs`` every second and shows the runs as a tree (parent above
children) with state, scope held and the first line of the last answer; clicking a run opens its
conversation, with a form to send it a message and a stop button. Data enters the DOM only as
text (never as markup), and its Content-Security-Policy allows only its own inline script and
style and requests to its own origin.
"""

from __future__ import annotations

import hashlib
from base64 import b64encode
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from luftpause.runtime.auth import error_body
from luftpause.runtime.errors import RuntimeFault
from luftpause.runtime.pods import PERSON, Pods

PAGE_RESOURCE = "monitor.html"
MAX_MESSAGE_BYTES = 1024 * 1024


def page_html() -> bytes:
    """The page's bytes (package data); raises ``FileNotFoundError`` if installed without it."""
    return resources.files(__package__).joinpath(PAGE_RESOURCE).read_bytes()


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


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _fault(exc: RuntimeFault) -> Response:
    status = exc.status if exc.status in (400, 403, 404, 410) else 400
    return Response(error_body(str(exc)), status_code=status, media_type="application/json")


def monitor_routes(pods: Callable[[], Pods]) -> list[Route]:
    """The monitor's routes; ``pods()`` gives the runtime's :class:`Pods`."""
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
                return _json(await body(request))
            except RuntimeFault as exc:
                return _fault(exc)
            except ValueError as exc:
                return Response(error_body(str(exc)), status_code=400, media_type="application/json")

        return endpoint

    async def runs(request: Request) -> dict[str, Any]:
        return {"runs": pods().network()}

    async def conversation(request: Request) -> dict[str, Any]:
        return pods().conversation(request.path_params["handle"])

    async def send(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > MAX_MESSAGE_BYTES:
            raise ValueError(f"the message is over {MAX_MESSAGE_BYTES} bytes")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON body {{'message': text}}: {exc}") from None
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message.strip():
            raise ValueError("expected a JSON body {'message': non-empty text}")
        return pods().send(PERSON, request.path_params["handle"], message)

    async def stop(request: Request) -> dict[str, Any]:
        return pods().stop(PERSON, request.path_params["handle"])

    return [
        Route("/monitor", monitor_page, methods=["GET"]),
        Route("/monitor/runs", guarded(runs), methods=["GET"]),
        Route("/monitor/runs/{handle}", guarded(conversation), methods=["GET"]),
        Route("/monitor/runs/{handle}/send", guarded(send), methods=["POST"]),
        Route("/monitor/runs/{handle}/stop", guarded(stop), methods=["POST"]),
    ]
