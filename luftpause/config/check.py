"""``luftpause check-config``: check a configuration as a start would, and start nothing.

``luftpause check-config [--config FILE] [PROCESS [its setting flags]]`` reads the file (``--config``,
else ``LUFTPAUSE_CONFIG``, else the embedded default), lays the ``LUFTPAUSE_<TABLE>__<KEY>``
variables and the setting flags over it (:func:`luftpause.config.load_config`, the same call every
process makes), then runs the checks each process makes before it serves:

* ``scheduler``: the files of ``[scheduler.tls]``;
* ``dataplane``: the caller keys (``[dataplane] caller_keys`` or ``LUFTPAUSE_CALLER_KEYS``), the
  files of ``[dataplane.tls]`` and ``[dataplane.scheduler_tls]``;
* ``runtime``: the files of ``[runtime.tls]`` and ``[runtime.dataplane_tls]``, and that ``[runtime]
  state_dir`` can be written (or created: it is not created here);
* with no ``PROCESS``, all three, and the address pairs ``luftpause up`` refuses to start with
  (``[runtime] dataplane`` that does not reach ``[dataplane] listen``, ``[dataplane] scheduler``
  that does not reach ``[scheduler] grpc``).

Output: the effective configuration on stdout as TOML (every key with its value, defaults
included, what the variables and flags set laid in; for ``PROCESS``, only what it reads,
:data:`luftpause.config.READ_BY`), each one it could not build or check on stderr as
``luftpause check-config: <problem>``, one line each, then a last line saying how many there were.
An unknown key names the closest key of its table (``unknown key (did you mean 'listen'?)``).
Exit status: 0 with no problem, 2 with any (as a start refuses a bad configuration); ports in use
are not checked (nothing is started).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import tomli_w

from luftpause.config import READ_BY, Config, ConfigError, load_config, settings
from luftpause.config.arguments import add_config_argument, add_setting_arguments, setting_flags

PROCESSES = tuple(READ_BY)
"""The processes whose checks can be run alone: ``scheduler``, ``dataplane``, ``runtime``."""

PROBLEMS_EXIT = 2
"""Exit status when any problem was found (a start exits 2 on a bad configuration too)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and an optional ``PROCESS`` taking that process's setting flags."""
    add_config_argument(parser)
    processes = parser.add_subparsers(
        dest="process",
        metavar="PROCESS",
        required=False,
        help=f"check only what this process reads, with its flags ({', '.join(PROCESSES)}; "
        "default: all three, and the address pairs 'luftpause up' checks)",
    )
    for process in PROCESSES:
        sub = processes.add_parser(
            process,
            help=f"as 'luftpause {process}' would start",
            description=f"check the configuration as 'luftpause {process}' would start with it",
        )
        add_setting_arguments(sub, process)


def effective_toml(config: Config, parts: tuple[str, ...]) -> str:
    """``config`` as TOML: every key of ``parts`` (tables, arrays of tables, or one key such as
    ``"scheduler.http"``; :data:`~luftpause.config.READ_BY`) with its value, unset keys left out."""
    data: dict[str, Any] = config.model_dump(mode="json", exclude_none=True, exclude={"source"})
    chosen: dict[str, Any] = {}
    for part in parts:
        table, _, key = part.partition(".")
        if key:
            chosen.setdefault(table, {})[key] = data[table][key]
        else:
            chosen[table] = data[table]
    return tomli_w.dumps(chosen)


def _writable_dir(path: Path) -> str | None:
    """Why a journal could not be written under ``path`` (without creating it); ``None`` if it can."""
    at = path.absolute()
    while not at.exists():
        at = at.parent
    if not at.is_dir():
        return f"{at} is not a directory"
    if not os.access(at, os.W_OK | os.X_OK):
        return f"{at} is not writable"
    return None


def process_problems(config: Config, process: str) -> list[str]:
    """What ``luftpause <process>`` would refuse to start with beyond the configuration's shape:
    files it reads (TLS, caller keys), its state directory."""
    from luftpause.auth.tls import check_listener, check_peer

    checks: list[tuple[Any, ...]] = []
    if process == "scheduler":
        checks.append((check_listener, config.scheduler.tls, "scheduler.tls"))
    elif process == "dataplane":
        from luftpause.auth.callers import Access

        checks.append((Access.from_config, config))
        checks.append((check_listener, config.dataplane.tls, "dataplane.tls"))
        checks.append((check_peer, config.dataplane.scheduler_tls, "dataplane.scheduler_tls"))
    elif process == "runtime":
        checks.append((check_listener, config.runtime.tls, "runtime.tls"))
        checks.append((check_peer, config.runtime.dataplane_tls, "runtime.dataplane_tls"))
    problems = []
    for check, *arguments in checks:
        try:
            check(*arguments)
        except ConfigError as exc:
            problems.append(str(exc))
    if process == "runtime":
        why = _writable_dir(Path(config.runtime.state_dir))
        if why is not None:
            problems.append(f"[runtime] state_dir {config.runtime.state_dir!r}: {why}")
    return problems


def check(
    config_path: str | None, process: str | None, flags: dict[settings.KeyPath, tuple[str, str]]
) -> tuple[str | None, list[str]]:
    """``(the effective configuration as TOML or None, every problem)`` of the configuration a
    start of ``process`` (``None``: ``luftpause up``, all three) would read."""
    try:
        config = load_config(config_path, flags)
    except ConfigError as exc:
        return None, exc.problems
    problems = []
    for name in (process,) if process is not None else PROCESSES:
        problems += process_problems(config, name)
    if process is None:
        from luftpause.supervise.up import address_mismatches

        problems += address_mismatches(config)
    parts = (
        READ_BY[process]
        if process is not None
        else tuple(settings.tables(Config)) + tuple(settings.arrays_of_tables(Config))
    )
    return effective_toml(config, parts), problems


def run(args: argparse.Namespace) -> int:
    """Print the effective configuration and every problem; 0 with none, :data:`PROBLEMS_EXIT` with any."""
    process = getattr(args, "process", None)
    text, problems = check(args.config, process, setting_flags(args))
    if text is not None:
        print(text, end="", flush=True)
    for problem in problems:
        print(f"luftpause check-config: {problem}", file=sys.stderr)
    if problems:
        count = len(problems)
        print(f"luftpause check-config: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return PROBLEMS_EXIT
    return 0
