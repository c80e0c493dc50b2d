"""``luftpause top``: the runtime's run network in a terminal, as the monitor page shows it.

It polls the monitor's JSON (:mod:`luftpause.runtime.monitor`), ``GET /monitor/runs?version=V``,
with the runtime's bearer token, and draws the runs as a tree (spawner above its children), one
line each: name, handle, state, service class, turns, tool calls, the scope it holds and the
first line of its last answer. A header counts the runs by state and names the runtime.

It only watches. Sending a message to a run or stopping one is done on the page
(``/monitor``), or over MCP.

Fitting (live mode): the tree is cut to the terminal's height. Runs are taken active first
(running, or spawners of running runs), then newest first, each with the ancestors it needs to
hang from; siblings are shown in that order too, and what did not fit is counted on a last line
(``… N more runs``). ``--once`` prints every run (for scripts; pipe it to ``head``).

Errors: an unreachable runtime, a refused token (401) or another HTTP error is one line. With
``--once`` it goes to stderr and the exit code is 1; live, it stands in the header over the last
network seen while the poll goes on. Ctrl-C ends it with exit code 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from luftpause.config import split_host_port
from luftpause.runtime.auth import TOKEN_ENV

RUNS_PATH = "/monitor/runs"
DEFAULT_INTERVAL_SECONDS = 1.0
"""Seconds between polls (the page polls every second too; an unchanged poll costs the runtime a
comparison)."""
REQUEST_TIMEOUT_SECONDS = 10.0
ONCE_WIDTH = 200
"""Columns of a frame written to something that is not a terminal (``$COLUMNS`` wins): wide
enough that a script reading it gets whole names and handles."""
HEADER_LINES = 2
"""Lines above the tree: the title with the URL, and the counts (or the error)."""
TABLE_HEADER_LINES = 1
STATE_STYLES = {"running": "green", "idle": "cyan", "stopped": "dim"}


class TopError(Exception):
    """The network could not be read: the message is one line, for a person."""


# --- the network ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fitted:
    """What one frame shows: ``lines`` are ``(guide, run)`` in display order, ``guide`` the tree
    lines drawn before the run's name (``""`` for a root, ``├─ `` / ``└─ `` below a spawner,
    after ``│  `` or spaces for each level above); ``hidden`` the runs left out,
    ``hidden_running`` how many of them are running."""

    lines: list[tuple[str, Mapping[str, Any]]]
    hidden: int = 0
    hidden_running: int = 0


def fit(runs: Sequence[Mapping[str, Any]], limit: int | None) -> Fitted:
    """The runs of the monitor's ``runs`` list (oldest first, each with ``handle`` and
    ``parent``) as a tree of at most ``limit`` lines (``None``: all of them).

    A run whose parent is not in the list (evicted, or a caller's run) is a root. With ``limit``
    below the count, one line is kept for the count of the rest, and runs are chosen active
    first (running, or a spawner of a running run), then newest first, each with the ancestors
    it hangs from (a run whose missing ancestors do not fit is left out; a later one with fewer
    may still fit). Siblings are shown in the same order."""
    by_handle = {str(r.get("handle")): i for i, r in enumerate(runs)}

    def parent_of(i: int) -> int | None:
        parent = runs[i].get("parent")
        return by_handle.get(str(parent)) if parent is not None else None

    # Active: running, or the spawner of a running run at any level. Active runs come first,
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
    return Fitted(lines, len(hidden), sum(1 for r in hidden if r.get("state") == "running"))


def counts_line(runs: Iterable[Mapping[str, Any]]) -> str:
    """``12 runs: 3 running (1 awaiting approval), 8 idle, 1 stopped`` (states as the monitor's
    ``state``; ``runState`` ``AwaitingApproval`` counted apart among the running)."""
    by_state: dict[str, int] = {}
    total = awaiting = 0
    for run in runs:
        total += 1
        state = str(run.get("state"))
        by_state[state] = by_state.get(state, 0) + 1
        awaiting += run.get("runState") == "AwaitingApproval"
    parts = []
    for state in ("running", "idle", "stopped", *sorted(set(by_state) - {"running", "idle", "stopped"})):
        if by_state.get(state):
            extra = f" ({awaiting} awaiting approval)" if state == "running" and awaiting else ""
            parts.append(f"{by_state[state]:,} {state}{extra}")
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
    access = "".join(m[0] for m in first.get("access") or ())
    text = f"{'' if first.get('effect') == 'allow' else 'deny '}{access} {first.get('path')}"
    if len(rules) > 1:
        text += f" +{len(rules) - 1}"
    lent = len(scope.get("heldByChildren") or ())
    return text + (f" ({lent} lent)" if lent else "")


def state_text(run: Mapping[str, Any]) -> Text:
    """The pod state (``running``, ``idle``, ``stopped``) and, where it says more, the run's own
    state beside it: ``idle (failed)``, ``running (AwaitingApproval)``."""
    state = str(run.get("state"))
    own = run.get("runState")
    shown = state if own in (None, state, "running", "completed") else f"{state} ({own})"
    style = (
        "red" if own == "failed" else "yellow" if own == "AwaitingApproval" else STATE_STYLES.get(state, "")
    )
    return Text(shown, style=style)


def _one_line(text: str, style: str = "") -> Text:
    return Text(" ".join(text.split()), style=style, no_wrap=True, overflow="ellipsis")


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


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
    run). Every line is one terminal line: cells are cut with ``…``, never wrapped."""
    title = Text.assemble(("luftpause top", "bold"), "  ", url, no_wrap=True, overflow="ellipsis")
    if updated:
        title.append(f"  {updated}", style="dim")
    status = Text(no_wrap=True, overflow="ellipsis")
    if error is not None:
        status.append(error, style="bold red")
        if runs is not None:
            status.append("  (the last network read is shown)", style="dim")
    else:
        status.append(counts_line(runs or ()))
    parts: list[RenderableType] = [title, status]
    if not runs:
        return Group(*parts)
    limit = None if height is None else max(1, height - HEADER_LINES - TABLE_HEADER_LINES)
    fitted = fit(runs, limit)
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold")
    # The fixed columns never wrap; SCOPE and LAST ANSWER may be narrowed (rich narrows wrapping
    # columns first) and their texts, which never wrap, end in "…" where they are cut.
    table.add_column("RUN", no_wrap=True, overflow="ellipsis", max_width=40)
    table.add_column("HANDLE", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("CLASS", no_wrap=True)
    table.add_column("TURNS", no_wrap=True, justify="right")
    table.add_column("TOOLS", no_wrap=True, justify="right")
    table.add_column("SCOPE", max_width=40)
    table.add_column("LAST ANSWER")
    for guide, run in fitted.lines:
        name = run.get("name") or "(unnamed)"
        answer = run.get("lastAnswer") or (f"error: {run['error']}" if run.get("error") else "")
        table.add_row(
            Text.assemble((guide, "dim"), str(name)),
            str(run.get("handle")),
            state_text(run),
            str(run.get("serviceClass") or "-"),
            _number(run.get("turns")),
            _number(run.get("toolCalls")),
            _one_line(short_scope(run.get("scope"))),
            _one_line(str(answer), "" if run.get("lastAnswer") else "dim"),
        )
    parts.append(table)
    if fitted.hidden:
        running = f" ({fitted.hidden_running:,} running)" if fitted.hidden_running else ""
        parts.append(Text(f"… {fitted.hidden:,} more runs{running}", style="bold", no_wrap=True))
    return Group(*parts)


# --- the runtime ----------------------------------------------------------------------------------


def runtime_base_url(listen: str) -> str:
    """``http://host:port`` to reach a runtime listening on ``listen`` (``host:port``); an
    all-addresses listen (``0.0.0.0``, ``::``) is reached on loopback."""
    host, port = split_host_port(listen)
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def normalize_url(url: str) -> str:
    """The runtime's base URL from what a person passes: a trailing ``/``, ``/mcp`` or
    ``/monitor`` is dropped (the MCP endpoint and the page are what people copy)."""
    base = url.strip().rstrip("/")
    for suffix in ("/mcp", "/monitor"):
        base = base.removesuffix(suffix)
    if "://" not in base:
        base = "http://" + base
    return base


@dataclass
class NetworkPoller:
    """Reads ``GET {base}/monitor/runs`` with the bearer ``token``, sending the version it has so
    that an unchanged network costs one comparison (the runtime answers ``unchanged``)."""

    base: str
    token: str | None
    timeout: float = REQUEST_TIMEOUT_SECONDS
    version: str | None = None
    runs: list[dict[str, Any]] | None = field(default=None)

    def poll(self) -> list[dict[str, Any]]:
        """The network's runs (the monitor's ``runs`` list, oldest first). Raises
        :class:`TopError` with a one-line reason when the runtime cannot be read."""
        query = f"?{urllib.parse.urlencode({'version': self.version})}" if self.version else ""
        request = urllib.request.Request(
            self.base + RUNS_PATH + query, headers={"Accept": "application/json"}
        )
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise TopError(self._refusal(err.code, err.read())) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise TopError(f"{self.base}: cannot reach the runtime: {reason}") from None
        except ValueError as err:
            raise TopError(f"{self.base}{RUNS_PATH}: not JSON: {err}") from None
        if not isinstance(body, dict) or "version" not in body:
            raise TopError(f"{self.base}{RUNS_PATH}: not the monitor's answer (no version)")
        if body.get("unchanged") and self.runs is not None and body["version"] == self.version:
            return self.runs
        runs = body.get("runs")
        if not isinstance(runs, list):
            raise TopError(f"{self.base}{RUNS_PATH}: not the monitor's answer (no runs)")
        self.version, self.runs = str(body["version"]), [r for r in runs if isinstance(r, dict)]
        return self.runs

    def _refusal(self, status: int, raw: bytes) -> str:
        try:
            message = str(json.loads(raw)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = raw[:200].decode("utf-8", "replace").strip()
        if status == 401:
            if self.token:
                return f"{self.base}: 401: the runtime refused the token (a wrong --token or ${TOKEN_ENV})"
            return f"{self.base}: 401: the runtime needs a token: pass --token or set ${TOKEN_ENV}"
        if status == 404:
            return f"{self.base}: 404: no monitor here (is this the runtime's address?)"
        return f"{self.base}: HTTP {status}: {message}"


# --- the command ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from luftpause.cli import add_config_argument

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
        help="the runtime's base URL, e.g. http://127.0.0.1:7000 (default: from the configuration's "
        "[runtime] listen)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the runtime's bearer token (default: ${TOKEN_ENV}, else none)",
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
        help="print one frame with every run and exit (1 when the runtime cannot be read)",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return value


def _base_url(args: argparse.Namespace) -> str:
    if args.url:
        return normalize_url(args.url)
    from luftpause.cli import config_from_args

    return runtime_base_url(config_from_args(args).runtime.listen)


def run(args: argparse.Namespace) -> int:
    base = _base_url(args)
    token = args.token if args.token is not None else (os.environ.get(TOKEN_ENV) or None)
    poller = NetworkPoller(base, token)
    try:
        if args.once:
            return _once(poller)
        _live(poller, args.interval)
    except KeyboardInterrupt:
        pass
    return 0


def _once(poller: NetworkPoller) -> int:
    try:
        runs = poller.poll()
    except TopError as exc:
        print(f"luftpause top: {exc}", file=sys.stderr)
        return 1
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else ONCE_WIDTH
    Console(width=width).print(frame(runs, poller.base, height=None))
    return 0


def _live(poller: NetworkPoller, interval: float) -> None:
    console = Console()
    with Live(console=console, auto_refresh=False, screen=True, redirect_stdout=False) as live:
        while True:
            error = None
            try:
                poller.poll()
            except TopError as exc:
                error = str(exc) + f" (retrying every {interval:g} s)"
            updated = time.strftime("%H:%M:%S")
            shown = frame(poller.runs, poller.base, height=console.size.height, error=error, updated=updated)
            live.update(shown, refresh=True)
            time.sleep(interval)
