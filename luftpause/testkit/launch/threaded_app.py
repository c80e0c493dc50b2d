"""An aiohttp app served from its own thread and event loop, for tests that block on another loop.

A test that drives the runtime through the ``mcp`` client waits on its own event loop, while the
runtime calls back into a fake engine; serving that engine from a thread of its own keeps both
answering. Subclasses add their routes in :meth:`ThreadedApp.routes`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Self

from aiohttp import web

from luftpause.testkit.launch.procs import free_port


class ThreadedApp:
    """Serves :meth:`routes` on ``http://127.0.0.1:<port>`` from a daemon thread; ``start()`` /
    ``stop()`` (both block up to 10 s)."""

    def __init__(self, name: str = "threaded-app") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._runner: web.AppRunner | None = None

    def routes(self, app: web.Application) -> None:
        """Add the app's routes (in the subclass)."""
        raise NotImplementedError

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` on the app's loop (from any thread)."""
        self._loop.call_soon_threadsafe(callback)

    async def _start(self) -> None:
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():  # never started: nothing to wait for
            self._thread.join(10)
        self._loop.close()
