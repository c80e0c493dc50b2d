"""The command line every luftpause process shares: ``--config FILE``, the setting flags, and the
configuration they give (the flags are the top layer of :func:`luftpause.config.load_config`).

Each process's ``--help`` ends with every setting it reads (:data:`luftpause.config.READ_BY`), its
default, its environment variable and its flag (:data:`SETTING_FLAGS`), generated from the typed
configuration (:func:`luftpause.config.settings.help_text`); :func:`add_setting_arguments` adds
those flags and that text, and :func:`config_from_args` reads them.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from luftpause.config import READ_BY, Config, ConfigError, load_config, settings


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``; absent, ``LUFTPAUSE_CONFIG`` or the embedded default is used."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML configuration (default: $LUFTPAUSE_CONFIG, else the embedded default)",
    )


SETTING_FLAGS: dict[str, tuple[str, ...]] = {
    "scheduler": ("scheduler.grpc", "scheduler.http"),
    "dataplane": ("dataplane.listen", "dataplane.scheduler"),
    "runtime": ("runtime.listen", "runtime.dataplane", "runtime.state_dir"),
}
"""The settings a process takes as a flag (each named after its key: ``--listen``,
``--state-dir``): its listen addresses and the addresses of its peers. Every setting of a table
also has its environment variable (:mod:`luftpause.config.settings`)."""

_FLAG_DEST = "setting:"  # argparse dest of a setting's flag: "setting:dataplane.listen"


def add_setting_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """``command``'s setting flags (:data:`SETTING_FLAGS`), and the settings it reads
    (:data:`~luftpause.config.READ_BY`) as the end of its ``--help``."""
    flags: dict[settings.KeyPath, str] = {}
    for dotted in SETTING_FLAGS.get(command, ()):
        table, key = dotted.split(".")
        info = settings.tables(Config)[table].model_fields[key]
        flags[(table, key)] = flag = settings.flag_name(key)
        parser.add_argument(
            flag,
            dest=_FLAG_DEST + dotted,
            metavar=key.upper(),
            default=None,
            help=f"[{table}] {key}, over ${settings.env_name((table, key))} and the file "
            f"(default: {settings.default_text(info).removeprefix('= ')})".replace("%", "%%"),
        )
    width = max(40, min(shutil.get_terminal_size().columns - 2, 100))
    parser.epilog = settings.help_text(Config, READ_BY[command], flags, width)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def setting_flags(args: argparse.Namespace) -> dict[settings.KeyPath, tuple[str, str]]:
    """The setting flags given on the command line, as :func:`~luftpause.config.load_config` takes
    them: ``{("dataplane", "listen"): ("--listen", "0.0.0.0:8080")}``."""
    return {
        tuple(dest.removeprefix(_FLAG_DEST).split(".")): (settings.flag_name(dest.rsplit(".", 1)[1]), value)
        for dest, value in vars(args).items()
        if dest.startswith(_FLAG_DEST) and value is not None
    }


def config_from_args(args: argparse.Namespace) -> Config:
    """The configuration ``--config`` names (or the default), with the ``LUFTPAUSE_<TABLE>__<KEY>``
    environment variables and the setting flags given laid over it; a bad one ends the command.

    Prints ``luftpause <command>: <file>: <key>: <what was expected>`` (or ``<variable>: ...``,
    ``<flag>: ...``) to stderr and raises ``SystemExit(2)``.
    """
    try:
        return load_config(args.config, setting_flags(args))
    except ConfigError as exc:
        command = getattr(args, "command", None)
        print(f"luftpause {command}: {exc}" if command else f"luftpause: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
