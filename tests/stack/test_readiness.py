"""``/livez`` and ``/readyz`` (:mod:`luftpause.serving.health`): a process is ready when what it needs is.

* the dataplane, as real processes: ready with its scheduler link up and a healthy replica; not
  ready once the scheduler counts none healthy (it says so in every pong), nor while the scheduler
  is away; alive (``/livez`` 200) and ``/health`` unchanged throughout;
* the runtime, in-process: not ready until its journal is replayed and its runs resumed, nor once
  it is stopping.

The scheduler's own readiness (its first probe round) is in ``tests/scheduler/test_scheduler_metrics.py``.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from dataplane_procs import MODEL, scheduler_and_dataplane, wait_until
from runtime_helpers import MINIMAL_CONFIG, asgi_request, make_run, with_state_dir

from luftpause.config import load_config
from luftpause.runtime.runs.journal import JOURNAL_NAME
from luftpause.runtime.server import create_app
from luftpause.runtime.wiring import Runtime
from luftpause.supervise.up import not_ready
from luftpause.testkit.launch.procs import ChildProcess, free_port


def probe(url: str) -> tuple[int, dict[str, Any]]:
    """``GET url``: its status and JSON body, 503 included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


@pytest.mark.integration
def test_the_dataplane_is_ready_only_with_its_scheduler_and_a_healthy_replica(tmp_path: Path) -> None:
    port = free_port()
    engine = ChildProcess(
        "engine",
        ["fake-engine", "--port", str(port), "--model", MODEL],
        tmp_path / "engine.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        engine.start().wait_ready()
        with scheduler_and_dataplane(tmp_path, [f"http://127.0.0.1:{port}"]) as pair:
            readyz = f"{pair.dataplane_url}/readyz"
            scheduler = pair.status_url.removesuffix("/status")
            assert wait_until(lambda: probe(readyz)[0] == 200, 30), (probe(readyz), pair.logs())
            status, body = probe(readyz)
            assert body["status"] == "ok"
            assert body["checks"]["scheduler"]["ok"] is True
            assert body["checks"]["replicas"] == {
                "ok": True,
                "detail": "1 healthy, as the scheduler last said",
            }
            assert probe(f"{scheduler}/readyz")[0] == 200
            assert probe(f"{pair.dataplane_url}/livez") == (200, {"status": "ok", "checks": {}})

            engine.stop()  # the scheduler's next probe finds it down; the next pong says 0 healthy
            assert wait_until(lambda: probe(readyz)[0] == 503, 30), (probe(readyz), pair.logs())
            status, body = probe(readyz)
            assert body["status"] == "unready"
            assert body["checks"]["replicas"] == {
                "ok": False,
                "detail": "0 healthy, as the scheduler last said",
            }
            assert body["checks"]["scheduler"]["ok"] is True
            assert probe(f"{scheduler}/readyz")[0] == 200  # the scheduler itself still works: it holds turns
            assert probe(f"{pair.dataplane_url}/livez")[0] == 200
            assert pair.health()["status"] == "ok"  # /health: as before, 200 while serving
            # what up's banner says then (its runtime here: a port where nothing listens)
            path = tmp_path / "up.toml"
            path.write_text(
                (tmp_path / "luftpause.toml").read_text()
                + f'\n[runtime]\nlisten = "127.0.0.1:{free_port()}"\ndataplane = "{pair.dataplane_url}"\n'
            )
            lines = not_ready(load_config(path))
            assert lines[0] == "dataplane: replicas: 0 healthy, as the scheduler last said"
            assert lines[1].startswith("runtime: http://127.0.0.1:") and len(lines) == 2, lines

            pair.children["scheduler"].stop()
            assert wait_until(lambda: not probe(readyz)[1]["checks"]["scheduler"]["ok"], 30), pair.logs()
            status, body = probe(readyz)
            assert status == 503
            assert body["checks"]["scheduler"]["detail"].startswith("connecting to 127.0.0.1:")
            assert probe(f"{pair.dataplane_url}/livez")[0] == 200
            assert pair.health()["scheduler"] == "connecting"
    finally:
        engine.stop()


def runtime_config(state_dir: Path) -> Any:
    return with_state_dir(MINIMAL_CONFIG, state_dir)


def test_the_runtime_is_ready_once_its_journal_is_replayed_and_not_while_stopping(tmp_path: Path) -> None:
    config = runtime_config(tmp_path / "state")

    async def first_life() -> bytes:
        """A runtime that records one run, finishes it and stops: it leaves a journal."""
        app = create_app(config, token="")
        runtime: Runtime = app.state.runtime
        async with runtime.serving(with_mcp_sessions=False):
            run = runtime.registry.add(make_run("run-0123456789abcdef"))
            runtime.registry.finish(run, "completed", answer="a")
            _, _, metrics, _ = await asgi_request(app, "GET", "/metrics")
        return metrics

    async def second_life() -> list[tuple[int, bytes]]:
        app = create_app(config, token="")
        runtime: Runtime = app.state.runtime
        seen = [(await asgi_request(app, "GET", "/readyz"))[::2]]
        async with runtime.serving(with_mcp_sessions=False):
            seen.append((await asgi_request(app, "GET", "/readyz"))[::2])
            seen.append((await asgi_request(app, "GET", "/metrics"))[::2])
        seen.append((await asgi_request(app, "GET", "/readyz"))[::2])
        seen.append((await asgi_request(app, "GET", "/livez"))[::2])
        return seen

    first = asyncio.run(first_life()).decode()
    assert "luftpause_runtime_runs_started_total 1.0" in first
    assert 'luftpause_runtime_runs_ended_total{state="completed"} 1.0' in first
    before, during, (_, metrics), after, livez = asyncio.run(second_life())
    assert before[0] == 503
    assert orjson.loads(before[1]) == {
        "status": "unready",
        "checks": {"journal": {"ok": False, "detail": "not replayed yet, or the runtime is stopping"}},
    }
    assert during[0] == 200
    assert orjson.loads(during[1]) == {
        "status": "ok",
        "checks": {"journal": {"ok": True, "detail": "replayed; unfinished runs resumed"}},
    }
    assert after[0] == 503
    assert livez == (200, b'{"status":"ok","checks":{}}')
    text = metrics.decode()
    assert 'luftpause_runtime_runs{state="completed"} 1.0' in text  # the replayed run is held ...
    assert "luftpause_runtime_runs_started_total 0.0" in text  # ... but was not started here
    journal = tmp_path / "state" / JOURNAL_NAME
    assert f"luftpause_runtime_journal_bytes {float(journal.stat().st_size)}" in text
