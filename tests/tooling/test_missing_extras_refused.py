"""The extras: ``luftpause[otel]`` (exporting spans) and ``luftpause[tui]`` (``top``, ``loadgen``).

Each command that needs a missing extra refuses with one line naming it, and exit 2. The missing
module is simulated by ``sys.modules[name] = None`` (Python then raises ``ImportError`` on its
import, as when it is not installed) in a child interpreter running the CLI; the real thing, a
core install without either extra, is checked by tests/tooling/test_packaging.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from repo_paths import ROOT

from luftpause.extras import MissingExtra
from luftpause.observe import tracing

OTLP = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}  # never reached: refused before

_CLI_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from luftpause.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


def cli_without(
    missing: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``luftpause ARGV`` in a child interpreter where the modules ``missing`` (comma-separated)
    cannot be imported."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", _CLI_WITHOUT, missing, *argv],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


def assert_refused(result: subprocess.CompletedProcess[str], command: str, extra: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # one line, no traceback
    assert lines[0].startswith(f"luftpause {command}: ")
    assert lines[0].endswith(f"is not installed: pip install 'luftpause[{extra}]'")


@pytest.mark.parametrize(
    ("command", "argv"),
    [("top", ["top"]), ("loadgen", ["loadgen", "--agents", "1"])],
)
def test_top_and_loadgen_that_draw_without_rich_name_the_tui_extra(command: str, argv: list[str]) -> None:
    """Live ``top`` and the ``--agents`` summary table draw with rich."""
    assert_refused(cli_without("rich", *argv), command, "tui")


def test_help_of_a_command_needs_no_extra() -> None:
    """``top --help`` lists its options without rich (its live view is what needs it)."""
    result = cli_without("rich", "top", "--help")
    assert result.returncode == 0, result.stderr
    assert "--once" in result.stdout


@pytest.mark.anyio
async def test_loadgen_json_draws_nothing_and_needs_no_rich(make_engine: Any) -> None:
    """``loadgen --agents ... --json`` prints JSON only: it runs without rich (here against a
    simulated engine standing in for the proxy) and its summary is the JSON of the runs."""
    engine = await make_engine()
    argv = ["loadgen", "--proxy", engine.url, "--json", "--duration-s", "1", "--agents", "1"]
    result = await asyncio.to_thread(cli_without, "rich", *argv)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["groups"][0]["agents"] == 1 and summary["groups"][0]["completed"] >= 1


@pytest.mark.parametrize("command", ["scheduler", "dataplane", "runtime", "up"])
@pytest.mark.parametrize("missing", ["opentelemetry.sdk", "opentelemetry.exporter"])
def test_a_traced_command_without_the_sdk_names_the_otel_extra(
    command: str, missing: str, tmp_path: Path
) -> None:
    """Refused in the main process before anything else, even before ``--config`` is read (the
    file does not exist: a refusal for it would be another message)."""
    result = cli_without(missing, command, "--config", str(tmp_path / "absent.toml"), env=OTLP)
    assert_refused(result, command, "otel")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in result.stderr


@pytest.mark.parametrize("missing", ["rich", "opentelemetry.sdk,opentelemetry.exporter"])
def test_without_the_endpoint_the_serving_commands_need_no_extra(missing: str, tmp_path: Path) -> None:
    """With tracing off, the core install serves: the scheduler gets past the extras to its own
    check of ``--config`` (exit 2 naming the absent file, not an extra)."""
    result = cli_without(missing, "scheduler", "--config", str(tmp_path / "absent.toml"))
    assert result.returncode == 2
    assert "absent.toml" in result.stderr and "pip install" not in result.stderr


def test_print_config_needs_no_sdk_even_with_the_endpoint_set() -> None:
    result = cli_without("opentelemetry.sdk", "up", "--print-config", env=OTLP)
    assert result.returncode == 0, result.stderr
    assert "[scheduler]" in result.stdout


def test_require_sdk_and_setup_raise_an_import_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    tracing.require_sdk()  # not configured: nothing needed
    assert tracing.setup(tracing.SCHEDULER_SERVICE) is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(MissingExtra) as refused:
        tracing.require_sdk()
    assert refused.value.extra == "otel" and isinstance(refused.value, ImportError)
    with pytest.raises(MissingExtra, match=r"pip install 'luftpause\[otel\]'"):
        tracing.setup(tracing.SCHEDULER_SERVICE)
    assert tracing.active is False


def test_the_core_dependencies_leave_the_extras_out_and_dev_pulls_them_in() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {Requirement(r).name for r in requirements}

    core = names(project["dependencies"])
    extras = project["optional-dependencies"]
    assert {"rich", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"} & core == set()
    assert "opentelemetry-api" in core  # spans are the API's no-ops without the SDK
    assert names(extras["otel"]) == {
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
        "opentelemetry-exporter-otlp-proto-grpc",
    }
    assert names(extras["tui"]) == {"rich"}
    # make install: everything the tests need, every extra included
    (itself,) = [Requirement(r) for r in extras["dev"] if Requirement(r).name == "luftpause"]
    assert {"otel", "tui", "postgresql"} <= itself.extras
