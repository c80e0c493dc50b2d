"""The scheduler's HTTP side: ``GET /status`` (the core's snapshot as JSON) and ``GET /health``.

The JSON shape is documented in :mod:`luftpause.scheduler.core.snapshot`. Every error is answered
with the JSON error body of DESIGN.md's failure contract, ``{"error": {"message": "..."}}``: an
unknown path 404, a known path with another method 405 (with ``Allow``), a fault of ours 500.
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from luftpause.scheduler.host import SchedulerHost

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
        allowed = ", ".join(sorted(exc.allowed_methods))
        return error_response(
            405, f"{request.path} takes {allowed}, not {request.method}", {hdrs.ALLOW: allowed}
        )
    except web.HTTPNotFound:
        return error_response(404, f"no route {request.method} {request.path}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        return error_response(exc.status, exc.reason)
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(exc).__name__}")


def status_app(host: SchedulerHost) -> web.Application:
    """An aiohttp application serving ``/status`` and ``/health`` from ``host``."""

    async def status(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(host.status()), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/status", status)
    app.router.add_get("/health", health)
    return app
