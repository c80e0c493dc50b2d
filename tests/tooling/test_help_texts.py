"""``--help`` of the commands issue 8's review found short: ``luftpause loadgen`` and the examples
show every option's default, and the examples name the environment variables they read."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from repo_paths import ROOT

EXAMPLES = ROOT / "examples"


def help_of(*argv: str) -> str:
    """The ``--help`` text of ``python argv... --help``, whitespace folded to single spaces."""
    shown = subprocess.run(
        [sys.executable, *argv, "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return " ".join(shown.split())


def test_loadgen_help_shows_the_defaults_of_task_and_caller() -> None:
    from luftpause.testkit.commands.loadgen import DEFAULT_TASK

    shown = help_of("-m", "luftpause", "loadgen")
    assert f"the task of every run (default: {DEFAULT_TASK!r})" in shown
    assert "x-luftpause-caller of the group's runs (default: none, the header is not sent)" in shown


@pytest.mark.parametrize("example", ["openai_agent.py", "agents_sdk_agent.py", "langgraph_agent.py"])
def test_an_examples_help_shows_every_default_and_the_environment_it_reads(example: str) -> None:
    shown = help_of(str(EXAMPLES / example))
    assert "(default: $LUFTPAUSE_MODEL or llama-3.2-1b)" in shown
    assert "(default: example-<a new UUID>)" in shown
    assert "x-luftpause-class of every turn (default: interactive)" in shown
    assert "x-luftpause-caller of every turn (default: examples)" in shown
    assert "the agent's task (default: 'Find out what luftpause does and answer in one sentence.')" in shown
    assert "$LUFTPAUSE_BASE_URL" in shown


@pytest.mark.parametrize("process", ["scheduler", "dataplane", "runtime"])
def test_a_process_help_lists_every_setting_it_reads_with_its_default_variable_and_flag(process: str) -> None:
    """Generated from the typed configuration: a key another branch adds is checked here too."""
    from luftpause.config import READ_BY, Config, settings
    from luftpause.config.arguments import SETTING_FLAGS

    shown = help_of("-m", "luftpause", process)
    assert (
        "a flag beats its environment variable, which beats the --config file, which beats the default"
        in shown
    )
    flags = {tuple(dotted.split(".")) for dotted in SETTING_FLAGS[process]}
    tables, arrays = settings.tables(Config), settings.arrays_of_tables(Config)
    for part in READ_BY[process]:
        table, _, only = part.partition(".")
        model = tables.get(table) or arrays[table]
        assert (f"[{table}]" if table in tables else f"[[{table}]] (file only)") in shown
        for key, info in model.model_fields.items():
            if only and key != only:
                continue
            sub = settings.sub_table(info) if table in tables else None
            if sub is not None:  # a sub-table ([dataplane.limits]): a head, then each of its keys
                _assert_sub_table_listed(shown, (table, key), info, sub)
                continue
            line = f"{key} {settings.default_text(info)}"
            if table in tables:
                flag = f" {settings.flag_name(key)}" if (table, key) in flags else ""
                line += f"{flag} ${settings.env_name((table, key))}"
            assert f"{line} {settings.plain_description(info)}" in shown


def _assert_sub_table_listed(shown: str, path: tuple[str, ...], info: Any, sub: Any) -> None:
    """``[table.key]`` and its description, then each key, its own sub-tables in turn
    (``[scheduler.protection.batch]``)."""
    from luftpause.config import settings

    unset = " (unset)" if info.default is None else ""
    assert f"[{'.'.join(path)}]{unset} {settings.plain_description(info)}" in shown
    for sub_key, sub_info in sub.model_fields.items():
        inner = settings.sub_table(sub_info)
        if inner is not None:
            _assert_sub_table_listed(shown, (*path, sub_key), sub_info, inner)
            continue
        line = f"{'.'.join((*path[1:], sub_key))} {settings.default_text(sub_info)}"
        line += f" ${settings.env_name((*path, sub_key))}"
        assert f"{line} {settings.plain_description(sub_info)}" in shown


@pytest.mark.parametrize("process", ["scheduler", "dataplane", "runtime"])
def test_a_process_help_prints_values_never_a_python_repr(process: str) -> None:
    """``scheduler --help`` printed ``protection = ProtectionConfig(...)`` (and ``LimitsConfig(...)``)."""
    shown = help_of("-m", "luftpause", process)
    assert "Config(" not in shown and "LimitsConfig" not in shown
    assert "None" not in shown.replace("(unset)", "")


def test_the_setting_flags_say_what_they_override_and_their_default() -> None:
    shown = help_of("-m", "luftpause", "dataplane")
    assert (
        "--listen LISTEN [dataplane] listen, over $LUFTPAUSE_DATAPLANE__LISTEN and the file "
        "(default: '127.0.0.1:8080')"
    ) in shown
    shown = help_of("-m", "luftpause", "runtime")
    assert "--state-dir STATE_DIR [runtime] state_dir, over $LUFTPAUSE_RUNTIME__STATE_DIR" in shown
    assert "[[mcp_servers]] (file only)" in shown and "[scheduler] http = '127.0.0.1:5001'" in shown
