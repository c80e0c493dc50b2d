"""luftpause: a run-aware front door for LLM inference engines (proxy, scheduler, MCP runtime).

``luftpause up`` runs the whole stack; ``scheduler``, ``dataplane`` and ``runtime`` run one process
each; ``top`` watches the runtime's run network in the terminal; ``fake-engine``, ``fake-mcp`` and
``loadgen`` come from the test kit. Every subcommand lives in
its own module, which exposes ``add_arguments(parser)`` and ``run(args) -> int``; that module is
imported only when its command runs, so ``luftpause dataplane`` never loads the MCP SDK.

The three processes' ``--help`` end with every setting the process reads (:data:`luftpause.config.READ_BY`),
its default, its environment variable and its flag (:data:`SETTING_FLAGS`), generated from the typed
configuration (:func:`luftpause.settings.help_text`); those flags are added here, for every process
alike, and read by :func:`config_from_args`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Sequence

from luftpause import __version__, logs, settings
from luftpause.config import READ_BY, Config, ConfigError, load_config
from luftpause.extras import MissingExtra

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": (
        "luftpause.up",
        "run scheduler, dataplane and runtime (and, with no config or with --simulate, the simulated pool)",
    ),
    "scheduler": ("luftpause.scheduler.server", "run the scheduler (gRPC admission, HTTP status)"),
    "dataplane": ("luftpause.dataplane.server.command", "run the OpenAI-compatible proxy"),
    "runtime": ("luftpause.runtime.server", "run the MCP server that drives sub-agents"),
    "fake-engine": ("luftpause.testkit.fake_engine", "run the OpenAI-compatible engine simulator"),
    "fake-mcp": ("luftpause.testkit.fake_mcp", "run the fake MCP tool server (lookup, deep_search)"),
    "loadgen": (
        "luftpause.testkit.loadgen",
        "load over MCP (--spawn) or through the proxy (--agents), and a summary",
    ),
    "top": ("luftpause.top", "watch the runtime's run network in the terminal (the monitor's tree)"),
    "check-config": (
        "luftpause.check_config",
        "check the configuration (file, environment, flags) as a start would, start nothing",
    ),
}


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
also has its environment variable (:mod:`luftpause.settings`)."""

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


def process_title() -> str:
    """``luftpause <command> [args...]``: the name a server passes to granian's ``process_name``.

    granian retitles its processes when ``setproctitle`` is installed (as some engines' tooling
    does); without a name of ours, ``ps`` would show ``granian asgi ...`` and lose the command
    and its ``--config``, which operators (and ``luftpause up``'s tests) look for.
    """
    return " ".join(["luftpause", *sys.argv[1:]])


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="luftpause", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"luftpause {__version__}")
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=None,
        help=f"text, or one JSON object per line (default: ${logs.LOG_FORMAT_ENV}, else text)",
    )
    parser.add_argument(
        "--log-level",
        choices=tuple(logs.LEVELS),
        default=None,
        help=f"the lowest level logged; debug adds the HTTP clients' per-request lines "
        f"(default: ${logs.LOG_LEVEL_ENV}, else info)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(sub_parser)
            if name in READ_BY:
                add_setting_arguments(sub_parser, name)
    return parser


TRACED = ("up", "scheduler", "dataplane", "runtime")
"""The commands that export spans when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (``up`` by its children)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. A missing extra (:class:`~luftpause.extras.MissingExtra`)
    is one line on stderr naming the extra to install, and exit 2; so is an OTLP protocol that is
    not exported (:class:`luftpause.tracing.UnsupportedProtocol`) for a command that traces."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    # The first word naming a command (an option's value, such as --log-format's or --log-level's,
    # names none).
    command = next((a for a in args_in if a in COMMANDS), None)
    try:
        parser = build_parser(command)
        args = parser.parse_args(args_in)
        if args.command in TRACED and not getattr(args, "print_config", False):
            from luftpause import tracing

            try:
                tracing.require_sdk()  # here, before a granian worker would fail on it
            except tracing.UnsupportedProtocol as exc:
                print(f"luftpause {args.command}: {exc}", file=sys.stderr)
                return 2
        if args.log_format is not None:
            os.environ[logs.LOG_FORMAT_ENV] = args.log_format  # children and granian workers inherit it
        if args.log_level is not None:
            os.environ[logs.LOG_LEVEL_ENV] = args.log_level  # the same
        logs.configure(args.command)
        module = importlib.import_module(COMMANDS[args.command][0])
        result: int = module.run(args)
    except MissingExtra as exc:
        print(f"luftpause {command}: {exc}" if command else f"luftpause: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    raise SystemExit(main())
