"""``luftpause check-config``: the configuration a start would read, checked as a start checks it,
run as the real command (``python -m luftpause check-config``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from luftpause.config import load_config

REPLICA = """
[[replicas]]
name = "a"
url = "http://127.0.0.1:30001"
models = ["m"]
"""


def check_config(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("LUFTPAUSE_", "OTEL_"))}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "luftpause", "check-config", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=60,
    )


def problems(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The problem lines of stderr (the last line counts them), without the command's prefix."""
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    assert all(line.startswith("luftpause check-config: ") for line in lines), lines
    count = len(lines) - 1
    assert lines[-1] == f"luftpause check-config: {count} problem{'s' if count != 1 else ''}"
    return [line.removeprefix("luftpause check-config: ") for line in lines[:-1]]


def test_every_fault_of_a_file_is_one_line_with_the_key_it_may_be_a_typo_of(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(
        """
[dataplane]
listn = "127.0.0.1:8080"
[scheduler]
grpc = "nope"
[scheduler.protection.interactive]
max_hled = 3
"""
        + REPLICA
        + 'modles = ["x"]\ncolour = "blue"\n'
    )
    result = check_config("--config", "bad.toml", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert sorted(problems(result)) == sorted(
        [
            "bad.toml: dataplane.listn: unknown key (did you mean 'listen'?)",
            "bad.toml: scheduler.grpc: expected 'host:port', got 'nope'",
            "bad.toml: scheduler.protection.interactive.max_hled: unknown key (did you mean 'max_held'?)",
            "bad.toml: replicas[0].modles: unknown key (did you mean 'models'?)",
            "bad.toml: replicas[0].colour: unknown key",
        ]
    )


def test_a_start_names_the_key_an_unknown_one_may_be_a_typo_of_too(tmp_path: Path) -> None:
    (tmp_path / "typo.toml").write_text('[runtime]\nstate_dri = "s"\n' + REPLICA)
    started = subprocess.run(
        [sys.executable, "-m", "luftpause", "runtime", "--config", "typo.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert started.returncode == 2
    assert "typo.toml: runtime.state_dri: unknown key (did you mean 'state_dir'?)" in started.stderr


def test_a_good_configuration_prints_its_effective_keys_as_toml_that_reads_back_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "good.toml").write_text("[runtime]\nmax_depth = 5\n" + REPLICA)
    env = {"LUFTPAUSE_SCHEDULER__LEASES": "false"}
    result = check_config("--config", "good.toml", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    shown = tomllib.loads(result.stdout)
    assert shown["runtime"]["max_depth"] == 5  # the file
    assert shown["scheduler"]["leases"] is False  # the environment
    assert shown["dataplane"]["listen"] == "127.0.0.1:8080"  # a default
    (tmp_path / "shown.toml").write_text(result.stdout)
    for name in [n for n in os.environ if n.startswith("LUFTPAUSE_")]:
        monkeypatch.delenv(name)
    as_printed = load_config(tmp_path / "shown.toml")
    monkeypatch.setenv("LUFTPAUSE_SCHEDULER__LEASES", "false")
    as_started = load_config(tmp_path / "good.toml")
    assert as_printed.model_copy(update={"source": None}) == as_started.model_copy(update={"source": None})


def test_a_process_is_checked_with_its_own_flags_and_shows_only_what_it_reads(tmp_path: Path) -> None:
    result = check_config("dataplane", "--listen", "127.0.0.1:9999", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = tomllib.loads(result.stdout)
    assert set(shown) == {"dataplane", "replicas"}
    assert shown["dataplane"]["listen"] == "127.0.0.1:9999"
    refused = check_config("dataplane", "--listen", "9999", cwd=tmp_path)
    assert refused.returncode == 2 and problems(refused) == ["--listen: expected 'host:port', got '9999'"]


def test_a_bad_environment_variable_is_named(tmp_path: Path) -> None:
    result = check_config(cwd=tmp_path, env={"LUFTPAUSE_DATAPLANE__LISTN": "127.0.0.1:1"})
    assert result.returncode == 2
    assert problems(result) == ["LUFTPAUSE_DATAPLANE__LISTN: unknown key (did you mean 'listen'?)"]


def test_what_each_process_reads_before_it_serves_is_checked_and_every_problem_said(tmp_path: Path) -> None:
    """Files that a start reads (TLS, caller keys), a state directory it cannot write, and the
    address pairs ``up`` refuses: all of them, not the first only."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a directory")
    (tmp_path / "files.toml").write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:5000"
[scheduler.tls]
cert = "absent-cert.pem"
key = "absent-key.pem"
[dataplane]
scheduler = "127.0.0.1:5999"
caller_keys = "absent-keys.toml"
[runtime]
state_dir = "{blocked}/state"
"""
        + REPLICA
    )
    result = check_config("--config", "files.toml", cwd=tmp_path)
    assert result.returncode == 2
    said = problems(result)
    assert len(said) == 4, said
    assert any("scheduler.tls.cert" in line and "absent-cert.pem" in line for line in said), said
    assert any("absent-keys.toml" in line for line in said), said
    assert f"[runtime] state_dir '{blocked}/state': {blocked} is not a directory" in said
    assert any(line.startswith('[dataplane] scheduler = "127.0.0.1:5999" does not reach') for line in said)
    # The effective configuration is printed all the same: it could be built.
    assert tomllib.loads(result.stdout)["dataplane"]["caller_keys"] == "absent-keys.toml"


@pytest.mark.parametrize("process", ["scheduler", "dataplane", "runtime"])
def test_a_process_alone_is_checked_for_its_own_files_only(process: str, tmp_path: Path) -> None:
    (tmp_path / "tls.toml").write_text(f'[{process}.tls]\ncert = "c.pem"\nkey = "k.pem"\n' + REPLICA)
    result = check_config("--config", "tls.toml", process, cwd=tmp_path)
    assert result.returncode == 2
    assert all(f"{process}.tls" in line for line in problems(result))
