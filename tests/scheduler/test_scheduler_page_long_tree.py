"""The scheduler's page (``GET /`` on its HTTP port) with ``?runtime=`` over a long run tree: a real
scheduler and a real runtime holding 200 runs, 7 of them running (:mod:`long_tree_helpers`), read
in headless Chromium at a window of 1400 x 900 (a viewport of 1400 x 757) and paged with real
clicks.

Before, the runtime's runs were one table of every run, oldest first, under the replicas and the
held turns (the live ones off screen), their handles broken mid-string, and the charts left a
quarter of the width empty. Each test below fails on that page. Screenshots
(``scheduler-*.png``) are left in each test's tmp dir.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from browser_helpers import Page, devtools_browser, open_page
from long_tree_helpers import LIVE, TOTAL, LongTree, long_tree
from pods_helpers import until

pytestmark = pytest.mark.integration

WINDOW = (1400, 900)
PAGE_ROWS = 25
EN_DASH = "\N{EN DASH}"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LongTree]:
    with long_tree(tmp_path_factory.mktemp("long-tree"), with_scheduler=True) as grown:
        yield grown


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with devtools_browser(tmp_path_factory.mktemp("chromium"), WINDOW) as port:
        yield port


@asynccontextmanager
async def scheduler_page(browser: int, tree: LongTree) -> AsyncIterator[Page]:
    """The scheduler's page with ``?runtime=`` the tree's runtime, its run table filled."""
    query = urllib.parse.urlencode({"runtime": tree.pod.url})
    async with aiohttp.ClientSession() as session:
        page = await open_page(browser, f"{tree.scheduler_url}/?{query}", session)
        try:

            async def table() -> bool:
                return bool(
                    await page.evaluate("document.querySelectorAll('#runtime-runs tr[data-run]').length")
                )

            await until(table, "the runtime's runs on the page")
            yield page
        finally:
            await page.ws.close()


async def rows(page: Page) -> list[str]:
    """The handles of the runs in the table, top to bottom."""
    found: list[str] = await page.evaluate(
        "[...document.querySelectorAll('#runtime-runs tr[data-run]')].map((r) => r.dataset.run)"
    )
    return found


def test_the_run_table_is_paged_live_first_with_the_live_runs_in_view(
    browser: int, tree: LongTree, tmp_path: Path
) -> None:
    async def go() -> None:
        async with scheduler_page(browser, tree) as page:
            first = await rows(page)
            assert len(first) == PAGE_ROWS
            assert [tree.name_of(h) for h in first[: len(LIVE)]] == LIVE
            assert await page.text("#runtime-rows") == f"rows 1{EN_DASH}25 of 200"
            assert await page.evaluate("document.getElementById('runtime-prev').disabled") is True
            live = ", ".join(f'#runtime-runs tr[data-run="{tree.handles[name]}"]' for name in LIVE)
            assert await page.evaluate("scrollY") == 0
            assert await page.visible_without_scrolling(live)
            await page.screenshot(tmp_path / "scheduler-200-runs.png")

            seen = list(first)
            for number in range(2, TOTAL // PAGE_ROWS + 1):
                await page.click("#runtime-next")
                shown = f"rows {(number - 1) * PAGE_ROWS + 1}{EN_DASH}{number * PAGE_ROWS} of 200"

                async def turned(shown: str = shown) -> bool:
                    return await page.text("#runtime-rows") == shown

                await until(turned, f"page {number}")
                on_page = await rows(page)
                assert len(on_page) == PAGE_ROWS
                seen += on_page
            assert await page.evaluate("document.getElementById('runtime-next').disabled") is True
            assert sorted(seen) == sorted(tree.handles.values())  # every run once, over 8 pages
            await page.click("#runtime-prev")

            async def back() -> bool:
                return await page.text("#runtime-rows") == f"rows 151{EN_DASH}175 of 200"

            await until(back, "the page before the last")

    asyncio.run(go())


HANDLE_LINES = """Object.fromEntries([...document.querySelectorAll('#runtime-runs tr[data-run]')]
.map((row) => {
  const shown = [...row.querySelectorAll('span')].find((span) => span.textContent === row.dataset.run);
  return [row.dataset.run, shown ? shown.getClientRects().length : 0];
}))"""
"""Each run's row: how many lines its handle is laid out in (``getClientRects`` of the span)."""


def test_a_run_handle_is_never_broken_across_lines(browser: int, tree: LongTree) -> None:
    async def go() -> None:
        async with scheduler_page(browser, tree) as page:
            for width in (WINDOW[0], 700):  # a narrow window too: the table scrolls sideways
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=757,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                handles: dict[str, int] = await page.evaluate(HANDLE_LINES)
                assert set(handles.values()) == {1}, (width, handles)  # the old page: 2 lines each
                assert len(handles) == PAGE_ROWS
                callers = await page.line_boxes("#runtime-runs tr[data-run] .who")
                assert set(callers.values()) == {1}, (width, callers)
            await page.send("Emulation.clearDeviceMetricsOverride")

    asyncio.run(go())


def test_the_charts_share_the_whole_width(browser: int, tree: LongTree) -> None:
    async def go() -> None:
        async with scheduler_page(browser, tree) as page:

            async def drawn() -> bool:
                return await page.drawn_points('#chart-runs polyline[data-series="idle"]') >= 1

            await until(drawn, "the runs-by-phase chart")
            await page.assert_charts_share_one_row("#chart-runs svg")

    asyncio.run(go())
