"""Headless Chromium driven over the Chrome DevTools Protocol, for the pages' tests: start it
(:func:`devtools_browser`), open a page (:func:`open_page`), act on it as a person would (real mouse
and keyboard input events: :meth:`Page.click`, :meth:`Page.type`), read it (:meth:`Page.evaluate`,
:meth:`Page.text`) and take screenshots of it or of one element (:meth:`Page.screenshot`), which
:func:`colour_share` then reads back with Pillow.

The protocol is spoken over a websocket with aiohttp's client. Chromium must be installed
(``/usr/bin/chromium``, Debian's); without it a test fails, it is never skipped.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image
from pods_helpers import until

from luftpause.testkit.launch.procs import free_port

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        pytest.fail("chromium is not installed (Debian: apt-get install chromium)")
    return found


@contextmanager
def devtools_browser(workdir: Path, window: tuple[int, int] = (1280, 1000)) -> Iterator[int]:
    """Headless Chromium with a ``window`` (width, height in CSS pixels) and its DevTools port;
    its whole session killed afterwards."""
    port = free_port()
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
    process = subprocess.Popen(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--window-size={window[0]},{window[1]}",
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError("chromium's DevTools port never opened") from None
                time.sleep(0.1)
        yield port
    finally:
        # its whole session: the zygote and renderers are Chromium's children, not ours to reap
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(10)


class Page:
    """A minimal CDP client for one page target."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self.ids)
        await self.ws.send_json({"id": message_id, "method": method, "params": params})
        while True:
            reply = await self.ws.receive_json(timeout=30)
            if reply.get("id") == message_id:
                assert "error" not in reply, reply
                result: dict[str, Any] = reply.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def rect(self, selector: str) -> dict[str, float] | None:
        """The element's box in CSS pixels of the page (``x``, ``y``, ``width``, ``height``)."""
        found: dict[str, float] | None = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " const r = e.getBoundingClientRect();"
            " return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; })()"
        )
        return found

    async def center(self, selector: str) -> tuple[float, float] | None:
        rect = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        return (rect[0], rect[1]) if rect else None

    async def visible_without_scrolling(self, selector: str) -> bool:
        """Whether every element ``selector`` matches (one at least) is shown and wholly inside the
        window as it is now (its box between the top and the bottom of the viewport)."""
        inside = await self.evaluate(
            f"(() => {{ const all = [...document.querySelectorAll({json.dumps(selector)})];"
            " return all.length > 0 && all.every((e) => { const r = e.getBoundingClientRect();"
            " return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight"
            " && r.left >= 0 && r.right <= innerWidth; }); })()"
        )
        return bool(inside)

    async def line_boxes(self, selector: str) -> dict[str, int]:
        """For each element ``selector`` matches, by its text: how many line boxes it is laid out
        in (``getClientRects``; an inline element broken across lines has one per line)."""
        found: dict[str, int] = await self.evaluate(
            f"Object.fromEntries([...document.querySelectorAll({json.dumps(selector)})]"
            ".map((e) => [e.textContent, e.getClientRects().length]))"
        )
        return found

    async def scroll_to(self, selector: str) -> float:
        """Scroll the page until ``selector`` is in the middle of the window; the page's ``scrollY``."""
        found = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); return scrollY; })()"
        )
        assert found is not None, f"no {selector} on the page"
        return float(found)

    async def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the element's centre."""
        point = await until(lambda: self.center(selector), f"{selector} on the page")
        x, y = point
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    async def type(self, text: str) -> None:
        await self.send("Input.insertText", text=text)

    async def text(self, selector: str) -> str:
        found = f"document.querySelector({json.dumps(selector)})"
        value = await self.evaluate(f"(() => {{ const e = {found}; return e ? e.textContent : ''; }})()")
        return str(value or "")

    async def drawn_points(self, selector: str) -> int:
        """How many samples the chart line ``selector`` (a ``polyline`` the pages' shared chart code
        draws) has drawn: its ``data-points``, 0 while it is not on the page."""
        points = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " return e ? Number(e.dataset.points) : 0; })()"
        )
        return int(points or 0)

    async def assert_charts_share_one_row(self, svg: str) -> None:
        """The pages' ``#series`` charts stand side by side in one row that they fill from edge to
        edge (within a pixel), and the chart drawing ``svg`` is as wide as its figure and no taller
        than 120 px for it."""
        box: dict[str, Any] = await self.evaluate(
            "(() => { const row = document.querySelector('#series .charts').getBoundingClientRect();"
            " const charts = [...document.querySelectorAll('#series .chart')]"
            ".map((c) => c.getBoundingClientRect());"
            f" const svg = document.querySelector({json.dumps(svg)});"
            " const drawing = svg.getBoundingClientRect();"
            " const figure = svg.closest('.chart').getBoundingClientRect();"
            " return {left: row.left, right: row.right, first: charts[0].left,"
            " last: charts[charts.length - 1].right, tops: charts.map((c) => c.top),"
            " figure: figure.width, svg: drawing.width, height: drawing.height}; })()"
        )
        assert len(box["tops"]) > 1 and max(box["tops"]) - min(box["tops"]) < 1, box  # one row
        assert abs(box["first"] - box["left"]) < 1 and abs(box["last"] - box["right"]) < 1, box
        assert abs(box["svg"] - box["figure"]) < 1, box  # the drawing as wide as its figure
        assert box["height"] <= 120, box  # and no taller for it

    async def screenshot(self, path: Path, selector: str | None = None) -> Path:
        """A PNG of the whole page (``selector`` None) or of one element's box, written to ``path``."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if selector is not None:
            box = await self.rect(selector)
            assert box is not None, f"no {selector} on the page"
            params["clip"] = {**box, "scale": 1}
        shot = await self.send("Page.captureScreenshot", **params)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))
        return path


async def open_page(devtools_port: int, url: str, session: aiohttp.ClientSession) -> Page:
    async with session.get(f"http://127.0.0.1:{devtools_port}/json/list") as response:
        targets = await response.json()
    target = next(t for t in targets if t["type"] == "page")
    ws = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
    page = Page(ws)
    await page.send("Page.enable")
    await page.send("Page.navigate", url=url)
    return page


def hex_colour(value: str) -> tuple[int, int, int]:
    """``#rrggbb`` as an RGB triple."""
    return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)


def colour_share(png: Path, colour: str, tolerance: int = 24) -> float:
    """The share of ``png``'s pixels within ``tolerance`` (per channel) of ``colour`` (``#rrggbb``)."""
    r, g, b = hex_colour(colour)
    with Image.open(png) as image:
        data = image.convert("RGB").tobytes()
    count = len(data) // 3
    near = sum(
        1
        for i in range(0, count * 3, 3)
        if abs(data[i] - r) <= tolerance
        and abs(data[i + 1] - g) <= tolerance
        and abs(data[i + 2] - b) <= tolerance
    )
    return near / max(count, 1)


def png_size(png: Path) -> tuple[int, int]:
    with Image.open(png) as image:
        return image.size
