"""``luftpause runtime``: the MCP server that drives sub-agents.

Serves, on ``[runtime] listen``:

* ``/mcp``: streamable HTTP MCP (the official ``mcp`` SDK; both protocol eras it serves) with the
  tools of :mod:`luftpause.runtime.tools`;
* ``GET /status``: JSON ``{"runs": [run status], "upstream": [server]}``, every run of this process
  with its state, model, service class, turns, tool calls, failed tool calls and tokens;
* ``GET /health``: ``{"ok": true}``.

The ASGI app runs on granian (one worker process, uvloop). Its lifespan owns everything that
outlives a request, in this order: the shared aiohttp session to the dataplane, the upstream MCP
clients, the run registry's task group, and the SDK's session manager (which, with the SDK app
mounted inside ours, only runs if our lifespan enters it).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from luftpause.cli import add_config_argument, config_from_args
from luftpause.config import Config, split_host_port
from luftpause.runtime.loop import DataplaneClient, SubAgentLoop, new_http_session
from luftpause.runtime.runs import RunRegistry
from luftpause.runtime.tools import build_mcp_server
from luftpause.runtime.upstream import UpstreamPool

log = logging.getLogger("luftpause.runtime")


class Runtime:
    """The state of one runtime process: configuration, runs, upstream tools and the loop.

    ``loop`` exists only inside the lifespan (it needs the HTTP session the lifespan opens).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.registry = RunRegistry()
        self.upstream = UpstreamPool(config.mcp_servers)
        self._loop: SubAgentLoop | None = None

    @property
    def loop(self) -> SubAgentLoop:
        if self._loop is None:
            raise RuntimeError("the runtime is not started (outside its lifespan)")
        return self._loop

    @property
    def mcp_url(self) -> str:
        host, port = split_host_port(self.config.runtime.listen)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/mcp"

    def status(self) -> dict[str, Any]:
        """``GET /status``: ``{"runs": [Run.status()], "upstream": [UpstreamPool.describe() item]}``."""
        return {
            "runs": [run.status() for run in self.registry.all()],
            "upstream": self.upstream.describe(),
        }


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def create_app(config: Config) -> Starlette:
    """The runtime's ASGI app for ``config``: ``/mcp``, ``GET /status``, ``GET /health``."""
    runtime = Runtime(config)
    mcp = build_mcp_server(runtime)
    host, _ = split_host_port(config.runtime.listen)
    # The SDK turns on DNS-rebinding protection for loopback hosts itself; bound elsewhere, the
    # operator's network decides who may connect (REFERENCES.md, "transport_security").
    mcp_app = mcp.streamable_http_app(host=host)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            session = await stack.enter_async_context(new_http_session())
            await stack.enter_async_context(runtime.upstream)
            runtime._loop = SubAgentLoop(DataplaneClient(config.runtime.dataplane, session), runtime.upstream)
            await stack.enter_async_context(runtime.registry)
            await stack.enter_async_context(mcp.session_manager.run())
            print(f"luftpause runtime: MCP on {runtime.mcp_url}", flush=True)
            yield

    async def status(request: Request) -> Response:
        return _json(runtime.status())

    async def health(request: Request) -> Response:
        return _json({"ok": True})

    return Starlette(
        routes=[
            Route("/status", status, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Mount("/", app=mcp_app),
        ],
        lifespan=lifespan,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 then, 2 for a bad configuration."""
    config = config_from_args(args)
    # Our own INFO lines (upstream connections, failed runs); the libraries' per-request INFO
    # lines (httpx, the SDK) would bury them.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("luftpause").setLevel(logging.INFO)
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    host, port = split_host_port(config.runtime.listen)
    server = Granian(
        "luftpause.runtime.server:create_app",  # a label only: the loader below builds the app
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        workers=1,
        log_level=LogLevels.warning,
    )
    server.serve(target_loader=partial(create_app, config), wrap_loader=False)
    return 0
