"""The scheduler's HTTP side: ``GET /status`` (the core's snapshot as JSON) and ``GET /health``.

The JSON shape is documented in :mod:`luftpause.scheduler.core.snapshot`.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from luftpause.scheduler.host import SchedulerHost


def status_app(host: SchedulerHost) -> web.Application:
    """An aiohttp application serving ``/status`` and ``/health`` from ``host``."""

    async def status(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(host.status()), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/health", health)
    return app
