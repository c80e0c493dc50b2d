"""``luftpause --log-format json``: one JSON object per line from every luftpause process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from luftpause.cli import main
from luftpause.testkit.procs import ChildProcess, free_port


def _json_lines(log: Path) -> list[dict[str, object]]:
    records = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def _connected(records: list[dict[str, object]]) -> bool:
    return any(
        r["logger"] == "luftpause.dataplane" and str(r["message"]).startswith("connected to scheduler")
        for r in records
    )


def test_scheduler_dataplane_and_the_granian_worker_log_json_lines(tmp_path: Path) -> None:
    grpc, status, dataplane = free_port(), free_port(), free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{grpc}"\nhttp = "127.0.0.1:{status}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{dataplane}"\nscheduler = "127.0.0.1:{grpc}"\n'
        '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'
    )
    children = [
        ChildProcess(
            name,
            ["--log-format", "json", name, "--config", str(config)],
            tmp_path / f"{name}.log",
            env={"LUFTPAUSE_TOKEN": ""},
            ready_url=ready,
        )
        for name, ready in (
            ("scheduler", f"http://127.0.0.1:{status}/health"),
            ("dataplane", f"http://127.0.0.1:{dataplane}/health"),
        )
    ]
    try:
        for child in children:
            child.start().wait_ready()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not _connected(_json_lines(tmp_path / "dataplane.log")):
            time.sleep(0.1)
    finally:
        for child in reversed(children):
            child.stop()
    for name in ("scheduler", "dataplane"):
        records = _json_lines(tmp_path / f"{name}.log")
        for record in records:
            assert {"time", "level", "logger", "process", "message"} <= record.keys(), record
            assert record["process"] == name
    records = _json_lines(tmp_path / "dataplane.log")
    assert "_granian" in {r["logger"] for r in records}  # granian's own, through the same formatter
    assert any("LUFTPAUSE_TOKEN is not set" in str(r["message"]) for r in records)  # the main process
    assert _connected(records), records  # the worker process's own record


def test_an_unknown_log_format_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--log-format", "xml", "scheduler"])
    assert exited.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err
