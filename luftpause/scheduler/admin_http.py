"""The scheduler's admin API: replicas added, drained, put back and removed without a restart.

On the scheduler's HTTP listener (beside ``/status``), JSON in and out, every error in the JSON error
body of docs/architecture.md "Failure contract" (``{"error": {"message": "..."}}``):

=====================================  ===========================================================
``GET /admin/replicas``                ``{"replicas": [{<the [[replicas]] keys>, "state": "in
                                       rotation" | "draining" | "removing", "inflight": int}]}``
``POST /admin/replicas``               a replica as in ``[[replicas]]`` (a JSON object with the same
                                       keys): added, 201 with ``{"replica": {...}}``; 400 naming the
                                       key for a bad one, 409 for a name in the set
``POST /admin/replicas/{name}/drain``  no new run goes there; its runs finish there (200)
``POST /admin/replicas/{name}/restore``  back in rotation: ends a drain, or a removal not done (200)
``DELETE /admin/replicas/{name}``      removed: 200 ``{"removed": true}`` when it had nothing in
                                       flight, else 202 ``{"removed": false, "inflight": n}``: it
                                       takes no turn and leaves when its last turn ends
=====================================  ===========================================================

An unknown name is 404. The dataplanes learn every change over their ``Connect`` streams.

Access: every route needs ``Authorization: Bearer <LUFTPAUSE_TOKEN>`` (401 otherwise); with no
``LUFTPAUSE_TOKEN`` set the admin API is off (403 saying so), since anyone who reaches the port
could otherwise take every replica out. ``SIGHUP`` (re-reading the configuration file) needs no
token.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

import orjson
from aiohttp import hdrs, web
from pydantic import ValidationError

from luftpause.config import ReplicaConfig
from luftpause.config.faults import describe_fields
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.status_http import error_response

TOKEN_ENV = "LUFTPAUSE_TOKEN"
MAX_BODY_BYTES = 64 * 1024


def _tuples(value: Any) -> Any:
    """JSON with every array a tuple (the configuration's strict models take tuples)."""
    if isinstance(value, dict):
        return {key: _tuples(item) for key, item in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(item) for item in value)
    return value


def _json(status: int, value: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(value), content_type="application/json")


def add_admin_routes(app: web.Application, host: SchedulerHost, token: str | None = None) -> None:
    """Serve the routes of the module docstring from ``host`` on ``app``; ``token`` (default: read
    from ``LUFTPAUSE_TOKEN``) is what callers must send, ``None`` or ``""`` turns the API off."""
    expected = (token if token is not None else os.environ.get(TOKEN_ENV, "")).encode()

    def refused(request: web.Request) -> web.Response | None:
        if not expected:
            return error_response(403, f"the admin API is off: set {TOKEN_ENV} to use it")
        given = request.headers.get(hdrs.AUTHORIZATION, "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), expected):
            return error_response(
                401,
                f"missing or wrong bearer token (Authorization: Bearer <{TOKEN_ENV}>)",
                {hdrs.WWW_AUTHENTICATE: 'Bearer realm="luftpause"'},
            )
        return None

    async def listed(request: web.Request) -> web.Response:
        return refused(request) or _json(200, {"replicas": host.replica_list()})

    async def add(request: web.Request) -> web.Response:
        if (answer := refused(request)) is not None:
            return answer
        body = await request.content.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            return error_response(413, f"request body is over the limit of {MAX_BODY_BYTES} bytes")
        try:
            data: Any = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"request body is not valid JSON: {exc}")
        if not isinstance(data, dict):
            return error_response(400, "request body must be a JSON object (a [[replicas]] table)")
        try:
            replica = ReplicaConfig.model_validate(_tuples(data))
        except ValidationError as exc:
            return error_response(400, describe_fields(exc))
        try:
            host.add_replica(replica)
        except ValueError as exc:
            return error_response(409, str(exc))
        if replica.draining:
            host.drain_replica(replica.name)
        return _json(201, {"replica": replica.model_dump(mode="json")})

    def named(request: web.Request) -> str:
        return request.match_info["name"]

    async def drain(request: web.Request) -> web.Response:
        if (answer := refused(request)) is not None:
            return answer
        try:
            host.drain_replica(named(request))
        except KeyError:
            return error_response(404, f"no replica {named(request)!r} in the set")
        return _json(200, {"replica": named(request), "state": "draining"})

    async def restore(request: web.Request) -> web.Response:
        if (answer := refused(request)) is not None:
            return answer
        try:
            host.restore_replica(named(request))
        except KeyError:
            return error_response(404, f"no replica {named(request)!r} in the set")
        return _json(200, {"replica": named(request), "state": "in rotation"})

    async def remove(request: web.Request) -> web.Response:
        if (answer := refused(request)) is not None:
            return answer
        name = named(request)
        try:
            gone = host.remove_replica(name)
        except KeyError:
            return error_response(404, f"no replica {name!r} in the set")
        if gone:
            return _json(200, {"replica": name, "removed": True})
        return _json(202, {"replica": name, "removed": False, "inflight": host.state.replicas[name].inflight})

    app.router.add_get("/admin/replicas", listed)
    app.router.add_post("/admin/replicas", add)
    app.router.add_post("/admin/replicas/{name}/drain", drain)
    app.router.add_post("/admin/replicas/{name}/restore", restore)
    app.router.add_delete("/admin/replicas/{name}", remove)
