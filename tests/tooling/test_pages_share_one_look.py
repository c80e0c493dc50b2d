"""The scheduler's page and the runtime's monitor share one look and one vocabulary for run states:
the blocks of style and script in ``luftpause/pages/``, inlined into both as each is read, so each
page is served self-contained (no asset, no build step), every block allowed by its own
Content-Security-Policy. (Both are driven in Chromium by
``test_scheduler_page.py`` and ``test_runtime_monitor_page.py``.)"""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from luftpause import pages
from luftpause.runtime.web import monitor
from luftpause.scheduler import status_http


def blocks(page: bytes, tag: bytes) -> list[bytes]:
    return re.findall(rb"<" + tag + rb">(.*?)</" + tag + rb">", page, re.DOTALL)


SCHEDULER = status_http.page_html()
MONITOR = monitor.page_html()


def test_the_two_pages_share_their_look_and_their_chart_and_state_code_byte_for_byte() -> None:
    styles, scripts = blocks(SCHEDULER, b"style"), blocks(SCHEDULER, b"script")
    assert len(styles) == 2 and len(scripts) == 2  # the shared blocks, then the page's own script
    assert blocks(MONITOR, b"style")[:2] == styles
    assert blocks(MONITOR, b"script")[:1] == scripts[:1]
    assert b"const luftpausePages" in scripts[0]
    assert len(blocks(MONITOR, b"style")) == 3 and len(blocks(MONITOR, b"script")) == 2
    assert b"luftpause.pages:" not in SCHEDULER and b"luftpause.pages:" not in MONITOR  # all inlined
    assert pages.assemble(b"<!-- luftpause.pages: look.html -->\n").startswith(b"<style>")


def test_a_part_the_package_lacks_is_refused() -> None:
    with pytest.raises(FileNotFoundError):
        pages.assemble(b"<!-- luftpause.pages: nope.html -->\n")


@pytest.mark.parametrize(
    ("page", "csp"),
    [(SCHEDULER, status_http.page_csp), (MONITOR, monitor.page_csp)],
    ids=["scheduler", "monitor"],
)
def test_every_inline_block_is_allowed_by_its_hash_and_nothing_is_loaded(page: bytes, csp: object) -> None:
    policy = csp(page)  # type: ignore[operator]
    for tag, directive in ((b"script", "script-src"), (b"style", "style-src")):
        allowed = re.search(directive + r" ([^;]*)", policy)
        assert allowed is not None, policy
        for body in blocks(page, tag):
            digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
            assert f"'sha256-{digest}'" in allowed.group(1).split()
    assert "unsafe-inline" not in policy and "default-src 'none'" in policy
    # self-contained: no element loads anything, no stylesheet imports anything
    assert re.search(rb"<(link|img|iframe|object|embed)\b|\bsrc=|@import|url\(", page) is None
    # and no "<style>" or "<script>" inside a comment, which would shift what the hashes cover
    assert page.count(b"<script>") == page.count(b"</script>")
    assert page.count(b"<style>") == page.count(b"</style>")


def test_the_run_states_have_one_set_of_words() -> None:
    shared = blocks(SCHEDULER, b"script")[0].decode()
    words = re.search(r"const WORDS = \{([^}]*)\}", shared)
    assert words is not None
    pairs = dict(re.findall(r"(\w+): \"([^\"]+)\"", words.group(1)))
    assert pairs == {
        "running": "running",
        "AwaitingApproval": "awaiting approval",
        "completed": "completed",
        "failed": "failed",
        "cancelled": "cancelled",
    }
    own = blocks(MONITOR, b"script")[1].decode()
    assert "luftpausePages.runState(run.runState, run.state)" in own  # the monitor shows the run state
