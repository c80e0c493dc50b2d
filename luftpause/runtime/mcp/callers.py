"""Who is asking: the *caller* of an MCP request, for fairness at the scheduler (every turn of a
caller's runs carries it as ``x-luftpause-caller``) and to scope "your runs" (``status``,
``list``, ``await``'s events, the names of top-level runs).

In order, the first that applies (:func:`caller_of`):

1. an ``x-luftpause-caller`` header on the MCP request: the caller named explicitly (a harness
   configured with a header per user or per project: Claude Code ``--header``, Codex
   ``http_headers``);
2. the MCP session id (``Mcp-Session-Id``): every 2025-era connection is its own caller;
3. the client's declared ``clientInfo.name`` (2026-07-28 has no session; each request declares
   it in ``_meta``), unless it is an SDK's default (:data:`SDK_DEFAULT_CLIENT_NAMES`): a client
   named by its author is one caller across its reconnections, as docs/pods.md says ("Finding runs again");
4. a caller minted for the client: :class:`CallerCookie` sets ``luftpause-caller=client-<hex>``
   on its first answer (``Path=/mcp; HttpOnly; SameSite=Strict``) and HTTP clients that keep
   cookies (the Python SDK's httpx client does, for its whole life) send it back, so each such
   client is a caller of its own, as a 2025-era session is;
5. ``anonymous``.

Before the cookie, every 2026-era client that kept the Python SDK's default name (``mcp``) was the
one caller ``mcp``: they shared a fairness slot and saw each other's runs. The documented reconnect
still holds: a handle works from any connection, a caller's runs are found again with
``list(caller=...)``, and every run's ``caller`` is in its ``status`` and ``list`` entries and in
``spawn``'s answer.
"""

from __future__ import annotations

import secrets
from http.cookies import CookieError, SimpleCookie

from mcp.server.mcpserver import Context
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from luftpause.runtime.pods.actors import Actor
from luftpause.runtime.runs.tenants import Tenant, tenant_in

CALLER_HEADER = "x-luftpause-caller"
"""An MCP request's explicit caller (as on the proxy's turns)."""

CALLER_COOKIE = "luftpause-caller"
"""The cookie carrying a minted caller (:class:`CallerCookie`)."""

SDK_DEFAULT_CLIENT_NAMES = frozenset({"mcp"})
"""``clientInfo.name`` values that SDKs send when the client's author gave none: the Python SDK's
``DEFAULT_CLIENT_INFO`` (``mcp/client/session.py``: ``Implementation(name="mcp",
version="0.1.0")``). The TypeScript SDK has no default (a client must name itself)."""

MINTED_PREFIX = "client-"


def _cookie_caller(cookie_header: str | None) -> str | None:
    if not cookie_header:
        return None
    try:
        jar = SimpleCookie(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(CALLER_COOKIE)
    value = morsel.value if morsel is not None else ""
    return value if value.startswith(MINTED_PREFIX) and 0 < len(value) <= 64 else None


def tenant_of(ctx: Context) -> Tenant | None:
    """The tenant of the MCP request behind ``ctx``, as the HTTP edge found it from its caller key
    (``None``: no caller keys configured; :mod:`luftpause.runtime.runs.tenants`)."""
    try:
        request = ctx.request_context.request
    except (ValueError, AttributeError, LookupError):  # no request (in-process clients)
        return None
    return tenant_in(getattr(request, "scope", None))


def actor_of(ctx: Context) -> Actor:
    """The MCP caller behind ``ctx`` as an actor on runs, with its tenant."""
    return Actor.of_caller(caller_of(ctx), tenant_of(ctx))


def caller_of(ctx: Context) -> str:
    """The caller of the MCP request behind ``ctx`` (module docstring); with caller keys, narrowed
    under the key's caller (:meth:`Tenant.narrow`)."""
    tenant = tenant_of(ctx)
    caller = _caller_of(ctx)
    return tenant.narrow(caller) if tenant is not None else caller


def _caller_of(ctx: Context) -> str:
    headers = ctx.headers
    if headers is not None:
        named = headers.get(CALLER_HEADER)
        if named:
            return named
        session_id = headers.get("mcp-session-id")
        if session_id:
            return session_id
    params = ctx.session.client_params
    name = params.client_info.name if params is not None else None
    if isinstance(name, str) and name and name not in SDK_DEFAULT_CLIENT_NAMES:
        return name
    minted = _cookie_caller(headers.get("cookie") if headers is not None else None)
    return minted or "anonymous"


class CallerCookie:
    """ASGI middleware on ``path`` (``/mcp``): a request without a minted caller cookie gets one,
    seen by the request itself (added to its ``Cookie`` header) and set on its answer
    (``Set-Cookie``), so a client that keeps cookies is one caller for its life (module
    docstring). Other paths pass through untouched."""

    def __init__(self, app: ASGIApp, path: str = "/mcp") -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        cookies = [v.decode("latin-1") for k, v in headers if k == b"cookie"]
        if _cookie_caller("; ".join(cookies)) is not None:
            await self.app(scope, receive, send)
            return
        minted = f"{MINTED_PREFIX}{secrets.token_hex(8)}"
        pair = f"{CALLER_COOKIE}={minted}"
        others = [(k, v) for k, v in headers if k != b"cookie"]
        joined = "; ".join([*cookies, pair]) if cookies else pair
        inner = {**scope, "headers": [*others, (b"cookie", joined.encode("latin-1"))]}
        set_cookie = f"{pair}; Path={self.path}; HttpOnly; SameSite=Strict".encode("latin-1")

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", set_cookie)]}
            await send(message)

        await self.app(inner, receive, send_with_cookie)
