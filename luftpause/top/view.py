"""``luftpause top``: the runtime's run network in a terminal, as the monitor page shows it.

It polls the monitor's JSON (:mod:`luftpause.runtime.web.monitor`), ``GET /monitor/runs?version=V``,
with the runtime's bearer token, and draws the runs as a tree (spawner above its children), one
line each: name, handle, state, service class, turns, tool calls, the scope it holds and the
first line of its last answer. A header counts the runs by state and names the runtime.

States are in the words both pages use (docs/pods.md, "Run states"): the run's own state (the monitor's
``runState``) as ``running``, ``awaiting approval``, ``completed``, ``failed`` or ``cancelled``,
with ``(stopped)`` after a run stopped once it had completed or failed (it takes no more
messages; the monitor's ``state``, the pod state, says so).

It only watches. Sending a message to a run or stopping one is done on the page
(``/monitor``), or over MCP.

Fitting (live mode): the tree is cut to the terminal's height. Runs are taken active first
(running or awaiting approval, or spawners of such runs), then newest first, each with the
ancestors it needs to hang from; siblings are shown in that order too, and what did not fit is
counted on a last line (``… N more runs (2 running)``). ``--once`` prints every run (for
scripts; pipe it to ``head``). Every line is one terminal line: a narrow terminal drops columns
(SCOPE, then CLASS, TOOLS, TURNS) to leave the last answer some room, then cuts names, and cuts
handles and states only below about 50 columns.

What the runtime sends is shown, never obeyed: every string from it (answers, errors, names,
handles, states, classes, scope paths) has its control characters (C0, DEL, C1: ESC, BEL, CSI,
OSC...) replaced with ``�`` before it reaches the terminal, and cells are rich ``Text``, never
markup. A model's answer is attacker-influenced (tool results feed it): it must not move the
cursor, clear the screen, retitle the terminal or write the clipboard (OSC 52).

Errors are one line, ``luftpause top: <url>: <what>``, never a traceback:

* a ``--url`` that cannot work (empty, not ``http://``/``https://``, no valid host or port, a
  user name in it) is refused at once with exit code 2, as is live mode with standard output not
  a terminal (use ``--once``);
* the runtime unreachable, an answer that is not HTTP (a gRPC or other port), cut short, a
  refused token (401), another HTTP error (its body on one line, cut short), or an answer that is
  not the monitor's data: with ``--once`` the line goes to stderr and the exit code is 1; live, it
  stands in the header over the last network seen while the poll goes on.

``--url`` may be the page's address with its ``?token=``: the query is dropped from the URL and
its ``token`` used when ``--token`` is not given (``--token``, then the URL's token, then
``$LUFTPAUSE_TOKEN``); no token is ever shown, and redirects are not followed (the token would go
along). Ctrl-C, SIGTERM and SIGHUP end live mode with the terminal restored and exit code 0.

This module is the command (its arguments, ``--once``, the live loop and its signals) and the
live drawing (:func:`frame`, with ``rich``); the tree fitted and the runs' words are
:mod:`luftpause.top.network`, the columns and the plain ``--once`` frame
:mod:`luftpause.top.columns`, reading the monitor (the ``--url``, the poll, the checks of its
answer, the error lines) :mod:`luftpause.top.monitor_client`. The names of the first two are
importable from here too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from luftpause.config import listen_url
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.extras import MissingExtra
from luftpause.runtime.web.auth import TOKEN_ENV
from luftpause.top.columns import COLUMN_CAPS, COLUMNS, column_widths, plain_frame
from luftpause.top.monitor_client import NetworkPoller, TopError, one_line, parse_url
from luftpause.top.network import (
    Fitted,
    count_text,
    counts_line,
    fit,
    more_line,
    short_scope,
    state_word,
    stopped,
)

__all__ = [
    "COLUMNS",
    "DEFAULT_INTERVAL_SECONDS",
    "Fitted",
    "Frame",
    "add_arguments",
    "column_widths",
    "counts_line",
    "fit",
    "frame",
    "more_line",
    "plain_frame",
    "run",
    "short_scope",
    "state_text",
    "state_word",
    "stopped",
]

_rich_missing: ImportError | None = None
try:
    from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
    from rich.live import Live
    from rich.segment import Segment
    from rich.table import Table
    from rich.text import Text
except ImportError as exc:  # live mode needs it; --once prints plain text (plain_frame) without it
    _rich_missing = exc

DEFAULT_INTERVAL_SECONDS = 1.0
"""Seconds between polls (the page polls every second too; an unchanged poll costs the runtime a
comparison)."""
ONCE_WIDTH = 200
"""Columns of a frame written to something that is not a terminal (``$COLUMNS`` wins): wide
enough that a script reading it gets whole names and handles."""
HEADER_LINES = 2
"""Lines above the tree: the title with the URL, and the counts (or the error)."""
TABLE_HEADER_LINES = 1
STATE_STYLES = {
    "running": "green",
    "awaiting approval": "yellow",
    "completed": "cyan",
    "failed": "red",
    "cancelled": "dim",
}
USAGE_EXIT = 2
"""Exit code of a command line that cannot work (a bad ``--url``, live mode without a terminal),
as argparse and a bad ``--config`` give."""


# --- what the runtime sends, in a cell ------------------------------------------------------------


def _cell(value: object, style: str = "") -> Text:
    # Text, never a str cell: rich reads a str cell as markup ("[link=...]" writes OSC 8).
    return Text(one_line(str(value)), style=style, no_wrap=True, overflow="ellipsis")


def state_text(run: Mapping[str, Any]) -> Text:
    """The run's state in the pages' words (:func:`state_word`), with `` (stopped)`` after it for a
    run :func:`stopped` after it had completed or failed: ``failed (stopped)``."""
    word = state_word(run)
    text = Text(one_line(word), style=STATE_STYLES.get(word, ""), no_wrap=True, overflow="ellipsis")
    if stopped(run):
        text.append(" (stopped)", style="dim")
    return text


# --- one frame, fitted to the terminal's width ------------------------------------------------------


def _row(guide: str, run: Mapping[str, Any]) -> dict[str, Text]:
    name = run.get("name") or "(unnamed)"
    answer = run.get("lastAnswer") or (f"error: {run['error']}" if run.get("error") else "")
    return {
        "RUN": Text.assemble((guide, "dim"), one_line(str(name)), no_wrap=True, overflow="ellipsis"),
        "HANDLE": _cell(run.get("handle")),
        "STATE": state_text(run),
        "CLASS": _cell(run.get("serviceClass") or "-"),
        "TURNS": _cell(count_text(run.get("turns"))),
        "TOOLS": _cell(count_text(run.get("toolCalls"))),
        "SCOPE": _cell(short_scope(run.get("scope"))),
        "LAST ANSWER": _cell(answer, "" if run.get("lastAnswer") else "dim"),
    }


def _table(rows: list[dict[str, Text]], width: int) -> Table:
    desired = {
        name: min(COLUMN_CAPS.get(name, width), max([len(name), *(row[name].cell_len for row in rows)]))
        for name in COLUMNS
    }
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold")
    widths = column_widths(desired, width)
    for name, column_width in widths.items():
        justify: JustifyMethod = "right" if name in ("TURNS", "TOOLS") else "left"
        header = Text(name, no_wrap=True, overflow="ellipsis")
        table.add_column(header, width=column_width, no_wrap=True, overflow="ellipsis", justify=justify)
    for row in rows:
        table.add_row(*(row[name] for name in widths))
    return table


@dataclass(frozen=True)
class Frame:
    """One screen (a rich renderable): the header and the tree, laid out for the width it is
    rendered at; see :func:`frame`. No line ends in spaces."""

    runs: Sequence[Mapping[str, Any]] | None
    url: str
    height: int | None
    error: str | None = None
    updated: str | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in console.render_lines(self._parts(options.max_width), options, pad=False):
            yield from _without_trailing_spaces(line)
            yield Segment.line()

    def _parts(self, width: int) -> Group:
        title = Text.assemble(
            ("luftpause top", "bold"), "  ", one_line(self.url), no_wrap=True, overflow="ellipsis"
        )
        if self.updated:
            title.append(f"  {self.updated}", style="dim")
        status = Text(no_wrap=True, overflow="ellipsis")
        if self.error is not None:
            status.append(one_line(self.error), style="bold red")
            if self.runs is not None:
                status.append("  (the last network read is shown)", style="dim")
        else:
            status.append(one_line(counts_line(self.runs or ())))
        parts: list[RenderableType] = [title, status]
        if not self.runs:
            return Group(*parts)
        limit = None if self.height is None else max(1, self.height - HEADER_LINES - TABLE_HEADER_LINES)
        fitted = fit(self.runs, limit)
        parts.append(_table([_row(guide, run) for guide, run in fitted.lines], width))
        if fitted.hidden:
            parts.append(Text(more_line(fitted), style="bold", no_wrap=True, overflow="ellipsis"))
        return Group(*parts)


def _without_trailing_spaces(line: list[Segment]) -> Iterator[Segment]:
    end = len(line)
    while end and not line[end - 1].control and not line[end - 1].text.rstrip(" "):
        end -= 1
    for i, segment in enumerate(line[:end]):
        if i == end - 1 and not segment.control:
            segment = Segment(segment.text.rstrip(" "), segment.style)
        yield segment


def frame(
    runs: Sequence[Mapping[str, Any]] | None,
    url: str,
    *,
    height: int | None,
    error: str | None = None,
    updated: str | None = None,
) -> RenderableType:
    """One screen: the header (URL, counts or ``error``) and the tree of ``runs`` (the monitor's
    ``runs`` list; ``None``: none read yet), at most ``height`` lines in all (``None``: every
    run). Every line is one terminal line: columns are dropped or cut (``…``) to fit the width,
    never wrapped; every string is shown :func:`~luftpause.top.monitor_client.printable`.

    Raises :class:`~luftpause.extras.MissingExtra` without ``rich`` (the ``tui`` extra)."""
    if _rich_missing is not None:
        raise MissingExtra("tui", "its terminal view", _rich_missing)
    return Frame(runs, url, height, error, updated)


# --- the command ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Watch the runtime's run network in the terminal: the tree of runs (spawner above its "
        "children) with state, service class, turns, tool calls, scope held and last answer, "
        "refreshed every --interval seconds. It only watches: there are no keys to act; send a "
        "message to a run or stop it on the monitor page (/monitor). Ctrl-C ends it."
    )
    add_config_argument(parser)
    parser.add_argument(
        "--url",
        default=None,
        help="the runtime's base URL, e.g. http://127.0.0.1:7000 (the page's /monitor?token=... "
        "works too; default: from the configuration's [runtime] listen)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the runtime's bearer token (default: the URL's ?token=, else ${TOKEN_ENV}, else none)",
    )
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=DEFAULT_INTERVAL_SECONDS,
        metavar="S",
        help="seconds between polls (default: %(default)s)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one frame with every run and exit (1 when the runtime cannot be read); "
        "needed when standard output is not a terminal",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    url_token: str | None = None
    if args.url is not None:
        try:
            base, url_token = parse_url(args.url)
        except TopError as exc:
            print(f"luftpause top: {exc}", file=sys.stderr)
            return USAGE_EXIT
    else:
        base = listen_url(config_from_args(args).runtime.listen)
    if not args.once and _rich_missing is not None:
        raise MissingExtra("tui", "its terminal view", _rich_missing)
    if not args.once and not sys.stdout.isatty():
        print(
            "luftpause top: standard output is not a terminal: live mode draws on a terminal; "
            "use --once to print the network once",
            file=sys.stderr,
        )
        return USAGE_EXIT
    token = next((t for t in (args.token, url_token, os.environ.get(TOKEN_ENV)) if t is not None), None)
    poller = NetworkPoller(base, token or None)
    return _once(poller) if args.once else _live(poller, args.interval)


def _once(poller: NetworkPoller) -> int:
    try:
        runs = poller.poll()
    except TopError as exc:
        print(f"luftpause top: {exc}", file=sys.stderr)
        return 1
    terminal = sys.stdout.isatty() or os.environ.get("COLUMNS")
    width = shutil.get_terminal_size((ONCE_WIDTH, 25)).columns if terminal else ONCE_WIDTH
    try:
        print(plain_frame(runs, poller.base, width), flush=True)
    except BrokenPipeError:  # a reader that left early (``| head``): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""End live mode like Ctrl-C: the terminal's main screen and cursor are restored, exit code 0."""


class _Ended(BaseException):
    """Raised by the handler of an :data:`ENDING_SIGNALS` signal wherever live mode is."""


def _live(poller: NetworkPoller, interval: float) -> int:
    ended: list[int] = []

    def end(signum: int, frame: FrameType | None) -> None:
        for ending in ENDING_SIGNALS:  # a second signal must not cut the terminal's restoring short
            signal.signal(ending, signal.SIG_IGN)
        ended.append(signum)
        raise _Ended

    for ending in ENDING_SIGNALS:
        signal.signal(ending, end)
    console = Console()
    try:
        with Live(console=console, auto_refresh=False, screen=True, redirect_stdout=False) as live:
            while True:
                error = None
                try:
                    poller.poll()
                except TopError as exc:
                    error = str(exc) + f" (retrying every {interval:g} s)"
                updated = time.strftime("%H:%M:%S")
                shown = frame(
                    poller.runs, poller.base, height=console.size.height, error=error, updated=updated
                )
                live.update(shown, refresh=True)
                time.sleep(interval)
    except _Ended:
        pass
    except OSError:
        if not ended:
            raise
        # The terminal hung up (SIGHUP) before its screen could be restored: none is left to restore.
    return 0
