"""A load run that ends normally logs nothing at WARNING (issue 22).

At its deadline ``luftpause loadgen --agents`` cuts the runs still going, and with them the turns
still streaming: their clients leave mid-stream. The scheduler logged each such turn at WARNING
(``turn ... failed: client disconnected``), as it logs an engine that failed a turn, although its
core already counts a client that left as no fault of the engine (the circuit breaker skips it).
An operator reading WARNING lines at the end of every load run, or after every interrupted agent,
learns nothing. The engines here decode slowly (50 ms a token, 64 tokens a turn), so every
agent's turn is mid-stream when the 3 s deadline comes.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from repo_paths import ROOT

from luftpause.testkit.launch.stack import Stack

LOUD = re.compile(r"^\S+ \S+ \S+ (WARNING|ERROR|CRITICAL) .*$", re.MULTILINE)
"""A line of the text log format (``time level-name``: ``2026-12-07 13:35:12,077 luftpause.scheduler
WARNING ...``) at WARNING or above."""


def _logs(stack: Stack) -> dict[str, str]:
    return {
        name: child.log_path.read_text(errors="replace") if child.log_path and child.log_path.exists() else ""
        for name, child in stack.children.items()
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack.start(tmp_path_factory.mktemp("quiet"), decode_ms=50.0) as running:
        running.wait_connected()
        yield running


def test_the_end_of_a_load_run_logs_nothing_at_warning(stack: Stack) -> None:
    before = _logs(stack)
    done = subprocess.run(
        [
            sys.executable, "-m", "luftpause", "loadgen", "--proxy", stack.dataplane_url,
            "--agents", "3", "--class", "batch", "--caller", "bulk",
            "--agents", "1", "--class", "interactive", "--caller", "ide",
            "--duration-s", "3", "--max-tokens", "64", "--context-tokens", "64", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 0)
    after = _logs(stack)
    written = {name: after[name][len(before.get(name, "")) :] for name in after}
    # the cut was there to be logged: turns whose clients left mid-stream, told at INFO
    assert "failed: client disconnected" in written["scheduler"], stack.logs()
    loud = {name: [m.group(0) for m in LOUD.finditer(text)] for name, text in written.items()}
    loud = {name: lines for name, lines in loud.items() if lines}
    assert loud == {}, loud
    assert not LOUD.search(done.stderr), done.stderr


def test_an_engine_that_fails_a_turn_mid_stream_is_still_a_warning(stack: Stack) -> None:
    """What WARNING is for: the engine broke the stream, not the client."""
    before = _logs(stack)["scheduler"]
    url = urlsplit(stack.dataplane_url)
    body = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "max_tokens": 8,
        "luftpause_fault": {"kind": "die_mid_stream", "after_chunks": 2},
    }
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 200
        with pytest.raises(http.client.IncompleteRead):
            response.read()  # the stream the dataplane aborted: no clean end
    finally:
        connection.close()
    stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 0)
    written = _logs(stack)["scheduler"][len(before) :]
    lines = [m.group(0) for m in LOUD.finditer(written)]
    assert len(lines) == 1 and "WARNING" in lines[0] and "failed: engine" in lines[0], written
