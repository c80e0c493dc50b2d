"""luftpause: a run-aware front door for LLM inference engines (proxy, scheduler, MCP runtime).

``luftpause up`` runs the whole stack; ``scheduler``, ``dataplane`` and ``runtime`` run one process
each; ``top`` watches the runtime's run network in the terminal; ``fake-engine``, ``fake-mcp`` and
``loadgen`` come from the test kit. Every subcommand lives in
its own module, which exposes ``add_arguments(parser)`` and ``run(args) -> int``; that module is
imported only when its command runs, so ``luftpause dataplane`` never loads the MCP SDK.

The three processes' ``--help`` end with every setting the process reads (:data:`luftpause.config.READ_BY`),
its default, its environment variable and its flag, added for every process alike by
:func:`luftpause.config.arguments.add_setting_arguments`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from luftpause import __version__
from luftpause.config import READ_BY
from luftpause.config.arguments import add_setting_arguments
from luftpause.extras import MissingExtra
from luftpause.observe import logs

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": (
        "luftpause.supervise.up",
        "run scheduler, dataplane and runtime (and, with no config or with --simulate, the simulated pool)",
    ),
    "scheduler": ("luftpause.scheduler.server", "run the scheduler (gRPC admission, HTTP status)"),
    "dataplane": ("luftpause.dataplane.command", "run the OpenAI-compatible proxy"),
    "runtime": ("luftpause.runtime.server", "run the MCP server that drives sub-agents"),
    "fake-engine": ("luftpause.testkit.commands.fake_engine", "run the OpenAI-compatible engine simulator"),
    "fake-mcp": ("luftpause.testkit.fakes.fake_mcp", "run the fake MCP tool server (lookup, deep_search)"),
    "loadgen": (
        "luftpause.testkit.commands.loadgen",
        "load over MCP (--spawn) or through the proxy (--agents), and a summary",
    ),
    "top": ("luftpause.top.view", "watch the runtime's run network in the terminal (the monitor's tree)"),
    "check-config": (
        "luftpause.config.check",
        "check the configuration (file, environment, flags) as a start would, start nothing",
    ),
}


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
    not exported (:class:`luftpause.observe.tracing.UnsupportedProtocol`) for a command that traces."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    # The first word naming a command (an option's value, such as --log-format's or --log-level's,
    # names none).
    command = next((a for a in args_in if a in COMMANDS), None)
    try:
        parser = build_parser(command)
        args = parser.parse_args(args_in)
        if args.command in TRACED and not getattr(args, "print_config", False):
            from luftpause.observe import tracing

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
