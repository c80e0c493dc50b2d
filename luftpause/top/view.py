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
drawing (:func:`fit`, :func:`frame`); reading the monitor (the ``--url``, the poll, the checks
of its answer, the error lines) is :mod:`luftpause.top.monitor_client`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from luftpause.config import listen_url
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.extras import MissingExtra
from luftpause.runtime.web.auth import TOKEN_ENV
from luftpause.top.monitor_client import NetworkPoller, TopError, one_line, parse_url

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
RUN_STATE_WORDS = {
    "running": "running",
    "AwaitingApproval": "awaiting approval",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
"""A run state (``runState``) in the words of the pages' shared script (``WORDS`` in
``luftpause/scheduler/page.html`` and ``luftpause/runtime/web/monitor.html``); another state is
shown as it is sent, none as ``-``."""
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


# --- the network ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fitted:
    """What one frame shows: ``lines`` are ``(guide, run)`` in display order, ``guide`` the tree
    lines drawn before the run's name (``""`` for a root, ``├─ `` / ``└─ `` below a spawner,
    after ``│  `` or spaces for each level above); ``hidden`` the runs left out,
    ``hidden_running`` and ``hidden_awaiting`` how many of them are running and awaiting approval."""

    lines: list[tuple[str, Mapping[str, Any]]]
    hidden: int = 0
    hidden_running: int = 0
    hidden_awaiting: int = 0


def fit(runs: Sequence[Mapping[str, Any]], limit: int | None) -> Fitted:
    """The runs of the monitor's ``runs`` list (oldest first, each with ``handle`` and
    ``parent``) as a tree of at most ``limit`` lines (``None``: all of them).

    A run whose parent is not in the list (evicted, or a caller's run) is a root. With ``limit``
    below the count, one line is kept for the count of the rest, and runs are chosen active
    first (running or awaiting approval: pod state ``running``; or a spawner of such a run), then
    newest first, each with the ancestors
    it hangs from (a run whose missing ancestors do not fit is left out; a later one with fewer
    may still fit). Siblings are shown in the same order."""
    by_handle = {str(r.get("handle")): i for i, r in enumerate(runs)}

    def parent_of(i: int) -> int | None:
        parent = runs[i].get("parent")
        return by_handle.get(str(parent)) if parent is not None else None

    # Active: in a turn or a tool round, or the spawner of such a run at any level. Active runs come first,
    # then the newest (the monitor lists runs oldest first).
    active: set[int] = set()
    for i, run in enumerate(runs):
        at: int | None = i if run.get("state") == "running" else None
        while at is not None and at not in active:
            active.add(at)
            at = parent_of(at)
    order = sorted(range(len(runs)), key=lambda i: (i not in active, -i))
    if limit is None or len(runs) <= limit:
        chosen = set(range(len(runs)))
    else:
        budget = max(0, limit - 1)  # the last line says how many more there are
        chosen = set()
        for i in order:
            if len(chosen) >= budget:
                break
            path: list[int] = []
            at = i
            while at is not None and at not in chosen and at not in path:  # `path`: a cycle guard
                path.append(at)
                at = parent_of(at)
            if len(chosen) + len(path) <= budget:
                chosen.update(path)

    children: dict[int | None, list[int]] = {}
    for i in order:  # each sibling list in rank order
        if i in chosen:
            parent = parent_of(i)
            children.setdefault(parent if parent in chosen else None, []).append(i)
    lines: list[tuple[str, Mapping[str, Any]]] = []
    roots = children.get(None, [])
    # (run, the guide of its line, the guide its children's lines start with)
    stack = [(i, "", "") for i in reversed(roots)]
    seen: set[int] = set()
    while stack:
        i, guide, below = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        lines.append((guide, runs[i]))
        kids = children.get(i, [])
        for n, c in reversed(list(enumerate(kids))):
            last = n == len(kids) - 1
            stack.append((c, below + ("└─ " if last else "├─ "), below + ("   " if last else "│  ")))
    hidden = [r for i, r in enumerate(runs) if i not in seen]
    words = [state_word(r) for r in hidden]
    return Fitted(lines, len(hidden), words.count("running"), words.count("awaiting approval"))


def state_word(run: Mapping[str, Any]) -> str:
    """The run's own state (``runState``) in :data:`RUN_STATE_WORDS`: ``awaiting approval`` for
    ``AwaitingApproval``, an unknown state as it is, ``-`` for none."""
    own = run.get("runState")
    key = own if isinstance(own, str) else ""
    return RUN_STATE_WORDS.get(key, key or "-")


def stopped(run: Mapping[str, Any]) -> bool:
    """Stopped after it had completed or failed (pod state ``stopped``, run state not
    ``cancelled``): it keeps its word and takes no more messages."""
    return run.get("state") == "stopped" and run.get("runState") != "cancelled"


def counts_line(runs: Iterable[Mapping[str, Any]]) -> str:
    """``12 runs: 3 running, 1 awaiting approval, 7 completed, 1 failed`` (by
    :func:`state_word`, in the order of :data:`RUN_STATE_WORDS`, other states after them, then
    ``N with no state``)."""
    by_word: dict[str, int] = {}
    for run in runs:
        word = state_word(run)
        by_word[word] = by_word.get(word, 0) + 1
    known = list(RUN_STATE_WORDS.values())
    others = sorted(set(by_word) - {*known, "-"})
    parts = [f"{by_word[w]:,} {w}" for w in (*known, *others) if w in by_word]
    if "-" in by_word:
        parts.append(f"{by_word['-']:,} with no state")
    total = sum(by_word.values())
    noun = "run" if total == 1 else "runs"
    return f"{total:,} {noun}: " + ", ".join(parts) if parts else "no runs"


def short_scope(scope: Mapping[str, Any] | None) -> str:
    """The scope a run holds in a few characters: its first allow rule (``rw /ws/b``: read,
    write, path), ``+N`` more rules, ``N lent`` parts held by its children; ``-`` for none."""
    if not scope:
        return "-"
    rules = list(scope.get("granted") or ())
    if not rules:
        return "(empty)"
    first = next((r for r in rules if r.get("effect") == "allow"), rules[0])
    access = "".join(m[0] for m in first.get("access") or () if m)
    text = f"{'' if first.get('effect') == 'allow' else 'deny '}{access} {first.get('path')}"
    if len(rules) > 1:
        text += f" +{len(rules) - 1}"
    lent = len(scope.get("heldByChildren") or ())
    return text + (f" ({lent} lent)" if lent else "")


def state_text(run: Mapping[str, Any]) -> Text:
    """The run's state in the pages' words (:func:`state_word`), with `` (stopped)`` after it for a
    run :func:`stopped` after it had completed or failed: ``failed (stopped)``."""
    word = state_word(run)
    text = Text(one_line(word), style=STATE_STYLES.get(word, ""), no_wrap=True, overflow="ellipsis")
    if stopped(run):
        text.append(" (stopped)", style="dim")
    return text


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "-"


# --- one frame, fitted to the terminal's width ------------------------------------------------------

COLUMNS = ("RUN", "HANDLE", "STATE", "CLASS", "TURNS", "TOOLS", "SCOPE", "LAST ANSWER")
OPTIONAL_COLUMNS = ("TURNS", "TOOLS", "CLASS", "SCOPE")
"""Shown while they fit whole beside a useful last answer; dropped last one first (SCOPE first)."""
COLUMN_CAPS = {"RUN": 40, "SCOPE": 40}
"""Widest a name (with its tree guide) or a scope is shown, in columns."""
COLUMN_GAP = 2
RUN_MIN_WIDTH = 12
"""Columns a name keeps before handles and states are cut (a longer name is cut with ``…``)."""
ANSWER_MIN_WIDTH = 24
"""Columns the last answer keeps before an optional column is shown."""
ANSWER_FLOOR_WIDTH = 8
"""Below this many columns the last answer is not shown at all."""


def column_widths(desired: Mapping[str, int], width: int) -> dict[str, int]:
    """The columns shown in ``width`` terminal columns and the width of each (cells; gaps of
    :data:`COLUMN_GAP` not counted), from the width each would take whole (``desired``: every
    name of :data:`COLUMNS`). RUN, HANDLE and STATE are always shown: the name narrowed first
    (to :data:`RUN_MIN_WIDTH`), handles and states cut only when even that does not fit. The last
    answer comes next, then the optional columns while they fit whole beside
    :data:`ANSWER_MIN_WIDTH` of answer; what is left widens the name, then the answer."""
    shown = {
        "RUN": min(desired["RUN"], RUN_MIN_WIDTH),
        "HANDLE": desired["HANDLE"],
        "STATE": desired["STATE"],
    }

    def used(columns: Mapping[str, int]) -> int:
        return sum(columns.values()) + COLUMN_GAP * (len(columns) - 1)

    for name in ("RUN", "STATE", "HANDLE"):  # a terminal too narrow for whole handles
        shown[name] = max(1, shown[name] - max(0, used(shown) - width))
    answer_min = min(desired["LAST ANSWER"], ANSWER_MIN_WIDTH)
    room = width - used(shown) - COLUMN_GAP
    if room >= ANSWER_FLOOR_WIDTH:
        shown["LAST ANSWER"] = min(room, answer_min)
        for name in OPTIONAL_COLUMNS:
            if used(shown) + COLUMN_GAP + desired[name] > width:
                break
            shown[name] = desired[name]
    for name in ("RUN", "LAST ANSWER"):
        if name in shown:
            shown[name] += max(0, min(desired[name] - shown[name], width - used(shown)))
    return {name: shown[name] for name in COLUMNS if name in shown}


def _row(guide: str, run: Mapping[str, Any]) -> dict[str, Text]:
    name = run.get("name") or "(unnamed)"
    answer = run.get("lastAnswer") or (f"error: {run['error']}" if run.get("error") else "")
    return {
        "RUN": Text.assemble((guide, "dim"), one_line(str(name)), no_wrap=True, overflow="ellipsis"),
        "HANDLE": _cell(run.get("handle")),
        "STATE": state_text(run),
        "CLASS": _cell(run.get("serviceClass") or "-"),
        "TURNS": _cell(_number(run.get("turns"))),
        "TOOLS": _cell(_number(run.get("toolCalls"))),
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


def more_line(fitted: Fitted) -> str:
    """``… 9,961 more runs (2 running, 1 awaiting approval)``: the runs :func:`fit` left out."""
    live = [(fitted.hidden_running, "running"), (fitted.hidden_awaiting, "awaiting approval")]
    said = ", ".join(f"{n:,} {word}" for n, word in live if n)
    return f"… {fitted.hidden:,} more runs" + (f" ({said})" if said else "")


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


# --- the same frame as plain text (--once: drawn by nothing, so rich is not needed) ---------------


def cell_width(text: str) -> int:
    """Terminal columns ``text`` takes: 2 for an East Asian wide or full-width character, 0 for a
    combining one, else 1 (what rich's ``cell_len`` counts for the characters a run shows)."""
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, cut with ``…`` as rich's ``overflow="ellipsis"``."""
    if cell_width(text) <= width:
        return text
    kept, used = "", 0
    for char in text:
        step = cell_width(char)
        if used + step > width - 1:
            break
        kept += char
        used += step
    return kept + " " * (width - 1 - used) + "…"  # a wide character that did not fit: a space


def _plain_row(guide: str, run: Mapping[str, Any]) -> dict[str, str]:
    name = run.get("name") or "(unnamed)"
    answer = run.get("lastAnswer") or (f"error: {run['error']}" if run.get("error") else "")
    return {
        "RUN": guide + one_line(str(name)),
        "HANDLE": one_line(str(run.get("handle"))),
        "STATE": one_line(state_word(run)) + (" (stopped)" if stopped(run) else ""),
        "CLASS": one_line(str(run.get("serviceClass") or "-")),
        "TURNS": _number(run.get("turns")),
        "TOOLS": _number(run.get("toolCalls")),
        "SCOPE": one_line(short_scope(run.get("scope"))),
        "LAST ANSWER": one_line(str(answer)),
    }


def plain_frame(runs: Sequence[Mapping[str, Any]] | None, url: str, width: int) -> str:
    """What :func:`frame` shows of every run at ``width`` columns, as plain text with no style:
    the same lines, columns and cuts, no line ending in spaces. ``luftpause top --once`` prints it."""
    lines = [_cut(f"luftpause top  {one_line(url)}", width), _cut(one_line(counts_line(runs or ())), width)]
    if runs:
        rows = [_plain_row(guide, run) for guide, run in fit(runs, None).lines]
        desired = {
            name: min(
                COLUMN_CAPS.get(name, width), max([len(name), *(cell_width(row[name]) for row in rows)])
            )
            for name in COLUMNS
        }
        widths = column_widths(desired, width)
        for row in [{name: name for name in COLUMNS}, *rows]:
            cells = []
            for name, column_width in widths.items():
                cell = _cut(row[name], column_width)
                pad = " " * (column_width - cell_width(cell))
                cells.append(pad + cell if name in ("TURNS", "TOOLS") else cell + pad)
            lines.append((" " * COLUMN_GAP).join(cells).rstrip(" "))
    return "\n".join(lines)


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
