"""``luftpause up``: run the whole stack in the foreground and stop it as one.

With no configuration file (the embedded default) it also starts the simulated pool: one
``luftpause fake-engine`` per configured replica and one ``luftpause fake-mcp`` per configured MCP
server with a URL, on the ports their URLs name. With ``--config FILE`` it starts only scheduler,
dataplane and runtime, unless ``--simulate`` asks for the simulated pool too: to move the default
stack's ports, ``luftpause up --print-config > FILE``, edit the addresses, then
``luftpause up --config FILE --simulate`` (``--print-config`` prints the configuration ``up``
would use: with ``--config FILE``, that file). The ``LUFTPAUSE_<TABLE>__<KEY>`` environment
variables (:mod:`luftpause.config.settings`) apply to ``up`` and, inherited, to every child alike. It waits
for each process's ``GET /readyz`` (:mod:`luftpause.serving.health`), but for a dataplane in front of a pool
it did not start, whose engines may come later: that one it waits for until it is alive
(``/livez``), and the banner says what it is not ready for yet. It prints every endpoint's and
page's URL once everything answers (:func:`banner`), and stops
every child on Ctrl-C / SIGTERM.

It supervises (:class:`Supervisor`): a child that dies is logged with its last log lines and
started again after a backoff (0.5 s, doubling per restart in the window, at most 10 s), its log
appended to; the others keep serving meanwhile. Only a crash loop stops the stack: a child that
dies more than ``--max-restarts`` times (default 5) within ``--restart-window-s`` seconds (default
60), named in the message (docs/failover.md "luftpause up").

Exit status: 0 after Ctrl-C, 1 when a port it needs is taken, a child failed to start or a child
is in a crash loop, 2 for a bad configuration (also when two addresses that must name the same
place name different ports).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import TextIO
from urllib.parse import urlencode, urlsplit

import orjson

from luftpause.config import EMBEDDED_DEFAULT, Config, listen_url, settings, split_host_port
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.serving.ports import address_in_use
from luftpause.testkit.launch.procs import ChildProcess

READY_TIMEOUT_S = 60.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0

TOKEN_ENV = "LUFTPAUSE_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--logs",
        metavar="DIR",
        default=None,
        help="where each process writes its log (default: <runtime state_dir>/logs)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="with --config, also start a simulated engine per replica and a fake MCP server per "
        "MCP server URL, on the ports the file names (always so without --config)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        metavar="N",
        help="a child that dies is started again, unless it died more than N times within "
        "--restart-window-s: a crash loop, which stops the stack (default: %(default)s)",
    )
    parser.add_argument(
        "--restart-window-s",
        type=float,
        default=60.0,
        metavar="S",
        help="the window of --max-restarts, in seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the configuration up would use and exit: the --config file (else $LUFTPAUSE_CONFIG) "
        "as written, else the embedded default (a starting point for --config)",
    )


def plan(config: Config, logs: Path, simulate: bool = False) -> list[ChildProcess]:
    """The child processes to start, in start order (the simulated pool first).

    The simulated pool is started for the embedded default, and for a file when ``simulate``.
    """
    config_args = ["--config", str(Path(config.source).resolve())] if config.source else []
    children: list[ChildProcess] = []
    simulated = config.is_embedded_default or simulate
    if simulated:
        for replica in config.replicas:
            url = urlsplit(replica.url)
            models = [arg for m in replica.models for arg in ("--model", m)]
            # The dataplane tags turns for the order the replica says its engine keeps; the
            # simulated engine must keep it too (unset: FIFO, fake-engine's default).
            priority = ["--priority", replica.priority] if replica.priority else []
            children.append(
                ChildProcess(
                    f"engine {replica.name}",
                    [
                        "fake-engine",
                        "--host",
                        url.hostname or "127.0.0.1",
                        "--port",
                        str(url.port),
                        *models,
                        *priority,
                    ],
                    logs / f"engine-{replica.name}.log",
                    ready_url=f"{replica.url}{replica.health_path}",
                )
            )
        for server in config.mcp_servers:
            if server.url is None:
                continue
            url = urlsplit(server.url)
            children.append(
                ChildProcess(
                    f"mcp {server.name}",
                    ["fake-mcp", "--host", url.hostname or "127.0.0.1", "--port", str(url.port)],
                    logs / f"mcp-{server.name}.log",
                    ready_port=(url.hostname or "127.0.0.1", url.port or 80),
                )
            )
    children += [
        ChildProcess(
            "scheduler",
            ["scheduler", *config_args],
            logs / "scheduler.log",
            ready_url=f"{listen_url(config.scheduler.http)}/readyz",
        ),
        ChildProcess(
            "dataplane",
            ["dataplane", *config_args],
            logs / "dataplane.log",
            # Not ready while no replica is healthy: the engines up starts itself are up by now;
            # others may come later (the banner says so), and up must not give up on them.
            ready_url=f"{listen_url(config.dataplane.listen)}/{'readyz' if simulated else 'livez'}",
        ),
        ChildProcess(
            "runtime",
            ["runtime", *config_args],
            logs / "runtime.log",
            ready_url=f"{listen_url(config.runtime.listen)}/readyz",
        ),
    ]
    return children


def readiness_urls(config: Config) -> list[tuple[str, str]]:
    """``(process, its GET /readyz URL)`` for the three processes."""
    return [
        ("scheduler", f"{listen_url(config.scheduler.http)}/readyz"),
        ("dataplane", f"{listen_url(config.dataplane.listen)}/readyz"),
        ("runtime", f"{listen_url(config.runtime.listen)}/readyz"),
    ]


def not_ready(config: Config) -> list[str]:
    """One line per readiness check that fails now (``process: check: detail``), or per process
    whose ``/readyz`` cannot be read; empty when all three are ready."""
    lines = []
    for process, url in readiness_urls(config):
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        except OSError as exc:
            lines.append(f"{process}: {url}: {exc}")
            continue
        try:
            checks = orjson.loads(body)["checks"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            lines.append(f"{process}: {url} answered no readiness checks")
            continue
        lines += [f"{process}: {name}: {c['detail']}" for name, c in checks.items() if not c["ok"]]
    return lines


def _reaches(host: str, port: int | None, listen: str) -> bool | None:
    """Whether a client connecting to ``host:port`` reaches a server listening on ``listen``
    (``host:port``): False when it certainly does not, None when it may.

    Certain only when ``host`` is this machine (a loopback or all-addresses literal, ``localhost``,
    or the listen's own host) and the port differs. Another name on another port may be a proxy
    forwarding here; another name on the same port may be this machine: both may reach it.
    """
    listen_host, listen_port = split_host_port(listen)
    if port is None or port == listen_port:
        return None
    name = host.lower()
    if name in ("localhost", listen_host.lower()):
        return False
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    return False if address.is_loopback or address.is_unspecified else None


def address_mismatches(config: Config) -> list[str]:
    """One line per pair of addresses that must name the same place and certainly do not.

    ``[runtime] dataplane`` (a URL) must reach ``[dataplane] listen``, and ``[dataplane]
    scheduler`` must reach ``[scheduler] grpc``: ``up`` starts both ends of each, and a mismatch
    would leave every sub-agent turn failing (or sent to a stranger) and every chat turn waiting
    on a scheduler that is not there. Empty when every pair may match (:func:`_reaches`).
    """
    lines = []
    try:
        url = urlsplit(config.runtime.dataplane)
        url_port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    except ValueError:  # a port that is not a number: the runtime names it when it starts
        url, url_port = None, None
    if url is not None and _reaches(url.hostname or "", url_port, config.dataplane.listen) is False:
        lines.append(
            f'[runtime] dataplane = "{config.runtime.dataplane}" does not reach [dataplane] listen = '
            f'"{config.dataplane.listen}" (another port): the sub-agents\' turns would not go through '
            "this dataplane"
        )
    sched_host, sched_port = split_host_port(config.dataplane.scheduler)
    if _reaches(sched_host, sched_port, config.scheduler.grpc) is False:
        lines.append(
            f'[dataplane] scheduler = "{config.dataplane.scheduler}" does not reach [scheduler] grpc = '
            f'"{config.scheduler.grpc}" (another port): the dataplane would never connect and chat '
            "turns would wait"
        )
    return lines


def mismatch_message(mismatches: list[str], config: Config) -> str:
    """Why ``up`` refuses to start: one line per mismatch, naming both keys, their values and
    the docs' section on changing addresses in pairs (docs/operating.md, "Moving the ports")."""
    where = config.source or "embedded default"
    return "\n".join(
        f"luftpause up: {where}: {line}; give both the same port (docs/operating.md: Moving the ports)"
        for line in mismatches
    )


def busy_ports(config: Config, simulate: bool = False) -> list[str]:
    """The ``host:port`` addresses ``up`` would listen on that something already listens on.

    Checked before starting anything: a readiness probe cannot tell our child from a stranger.
    """
    addresses = [config.scheduler.grpc, config.scheduler.http, config.dataplane.listen, config.runtime.listen]
    if config.is_embedded_default or simulate:
        for url in [r.url for r in config.replicas] + [s.url for s in config.mcp_servers if s.url]:
            parts = urlsplit(url)
            addresses.append(f"{parts.hostname}:{parts.port}")
    busy = []
    for address in addresses:
        try:
            if address_in_use(address):
                busy.append(address)
        except OSError as exc:
            busy.append(f"{address} ({exc.strerror})")
    return busy


def busy_message(busy: list[str], config: Config) -> str:
    """Why ``up`` refuses to start, and how to move its ports instead of stopping the other."""
    if config.is_embedded_default:
        move = (
            "or move luftpause: luftpause up --print-config > luftpause.toml, change the addresses "
            "there, then luftpause up --config luftpause.toml --simulate"
        )
    else:
        move = f"or change these addresses in {config.source}"
    return (
        f"luftpause up: already in use: {', '.join(busy)}; stop what listens there first, {move} "
        "(docs/operating.md: Moving the ports)"
    )


def pages(config: Config) -> list[tuple[str, str]]:
    """Every endpoint and page of the three processes, as ``(what, URL)`` to reach it from this
    machine (:func:`luftpause.config.listen_url`: IPv6 in brackets, an all-addresses listen on
    loopback), in the order the banner prints them. The scheduler's page is given the runtime
    (``?runtime=``), so that it shows the run tree too."""
    scheduler = listen_url(config.scheduler.http)
    dataplane = listen_url(config.dataplane.listen)
    runtime = listen_url(config.runtime.listen)
    return [
        ("OpenAI base_url", f"{dataplane}/v1"),
        ("MCP endpoint", f"{runtime}/mcp"),
        ("scheduler page", f"{scheduler}/?{urlencode({'runtime': runtime}, safe=':/')}"),
        ("scheduler status", f"{scheduler}/status"),
        ("runtime monitor", f"{runtime}/monitor"),
        ("runtime status", f"{runtime}/status"),
        ("metrics", "  ".join(f"{base}/metrics" for base in (scheduler, dataplane, runtime))),
        ("ready", "  ".join(f"{base}/readyz" for base in (scheduler, dataplane, runtime))),
    ]


def banner(
    config: Config,
    logs: Path,
    simulate: bool = False,
    token_set: bool = False,
    unready: list[str] | None = None,
) -> str:
    """The lines printed once every child answers: every page's URL (:func:`pages`), the
    replicas and the logs; with ``token_set`` (``LUFTPAUSE_TOKEN`` is set), where the token goes,
    else one line saying that no token is set; with ``unready`` (:func:`not_ready`'s lines), what
    is not ready yet."""
    pool = ", ".join(f"{r.name} ({r.url})" for r in config.replicas)
    urls = pages(config)
    rows = [*urls, ("models", ", ".join(config.models)), ("replicas", pool), ("logs", f"{logs}/")]
    for index, line in enumerate(unready or []):
        rows.append(("not ready" if index == 0 else "", line))
    if token_set:
        page = dict(urls)
        rows += [
            ("token", f"{TOKEN_ENV} is set: /v1, /mcp and both /status need"),
            ("", "'Authorization: Bearer <token>'; the pages take ?token=<token> in their address:"),
            ("", f"{page['scheduler page']}&token=${TOKEN_ENV}"),
            ("", f"{page['runtime monitor']}?token=${TOKEN_ENV}"),
        ]
    else:
        rows.append(("token", f"{TOKEN_ENV} is not set: every route is open to whoever reaches it"))
    lines = [
        "luftpause is up"
        + (" (embedded default: simulated engines)" if config.is_embedded_default else "")
        + (" (simulated engines)" if simulate and not config.is_embedded_default else ""),
        *(f"  {what:<17} {url}".rstrip() for what, url in rows),
        "Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def config_text(config: Config) -> str:
    """The TOML text ``config`` was read from, as written (comments kept, stripped of leading
    and trailing blank lines): its file's, or the embedded default's. ``OSError`` when the file
    can no longer be read."""
    if config.source is None:
        return EMBEDDED_DEFAULT.strip()
    return Path(config.source).read_text(encoding="utf-8").strip()


class CrashLoop(Exception):
    """A child died more often than the supervisor allows; ``str(err)`` names it."""


class Supervisor:
    """Starts a dead child again, with backoff, until it dies too often.

    ``Supervisor(children, max_restarts, window_s)``; call :meth:`check` every loop turn with the
    clock (``time.monotonic()`` seconds). A child found dead is logged (to ``err``) with its exit
    status and last log lines, and started again ``FIRST_BACKOFF_S`` later, doubling for each
    restart it had within ``window_s`` up to ``MAX_BACKOFF_S``; the one restart more than
    ``max_restarts`` within ``window_s`` raises :class:`CrashLoop` instead. ``children`` is
    updated in place (a restarted child is a new :class:`ChildProcess`, its log appended to).
    """

    def __init__(self, children: list[ChildProcess], max_restarts: int, window_s: float, err: TextIO) -> None:
        self.children = children
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.err = err
        self.restarts: dict[str, list[float]] = {}
        """Child name -> when it died, within the window."""
        self.due: dict[str, float] = {}
        """Child name -> when it is started again."""

    def check(self, now: float) -> None:
        """Notice dead children and start again those whose backoff is over. Raises :class:`CrashLoop`."""
        for index, child in enumerate(self.children):
            name = child.name
            if name in self.due:
                if now >= self.due[name]:
                    del self.due[name]
                    fresh = child.again()
                    self.children[index] = fresh.start()
                    print(f"luftpause up: {name} started again (pid {fresh.pid})", file=self.err, flush=True)
                continue
            code = child.poll()
            if code is None:
                continue
            died = [t for t in self.restarts.get(name, []) if now - t < self.window_s] + [now]
            self.restarts[name] = died
            print(f"luftpause up: {name} exited with {code}", file=self.err, flush=True)
            print(child.log_tail(), file=self.err, flush=True)
            if len(died) > self.max_restarts:
                times = f"{len(died)} time{'s' if len(died) != 1 else ''}"
                raise CrashLoop(
                    f"{name} exited {times} within {self.window_s:g} s "
                    f"(--max-restarts {self.max_restarts}): a crash loop; stopping the stack"
                )
            backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (len(died) - 1))
            self.due[name] = now + backoff
            print(
                f"luftpause up: starting {name} again in {backoff:g} s "
                f"(restart {len(died)} of at most {self.max_restarts} within {self.window_s:g} s); "
                "the others keep serving",
                file=self.err,
                flush=True,
            )


class _Stop(Exception):
    """Raised by the first SIGINT / SIGTERM, wherever ``run`` is, to begin the shutdown."""


def _ignore_ending_signals() -> None:
    """From here on SIGINT and SIGTERM do nothing: the shutdown has begun and a second Ctrl-C
    must not cut it short (it used to escape as a traceback, exit 1, mid-way through stopping)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _stop_once(signum: int, frame: FrameType | None) -> None:
    # Ignore first: a signal already caught at C level but not yet handled is then dropped too
    # (CPython skips a pending signal whose handler is SIG_IGN by the time it runs).
    _ignore_ending_signals()
    raise _Stop


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # a bad file is refused (exit 2), with --print-config too
    if args.print_config:
        print(config_text(config))
        overriding = settings.from_environment(Config).sources
        if overriding:  # they apply to up and its children, but are not in the text above
            names = ", ".join(sorted({name for name, _ in overriding.values()}))
            print(f"luftpause up: the environment overrides this text: {names}", file=sys.stderr)
        return 0
    mismatches = address_mismatches(config)
    if mismatches:  # before starting anything: a warning would scroll away under the logs
        print(mismatch_message(mismatches, config), file=sys.stderr)
        return 2
    busy = busy_ports(config, args.simulate)
    if busy:
        print(busy_message(busy, config), file=sys.stderr)
        return 1
    logs = Path(args.logs) if args.logs else Path(config.runtime.state_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    children = plan(config, logs, args.simulate)
    started: list[ChildProcess] = []
    try:
        signal.signal(signal.SIGTERM, _stop_once)
        signal.signal(signal.SIGINT, _stop_once)
        for child in children:
            print(f"starting {child.name} ...", flush=True)
            started.append(child.start())
            child.wait_ready(READY_TIMEOUT_S)
        token_set = bool(os.environ.get(TOKEN_ENV))
        print(banner(config, logs, args.simulate, token_set, not_ready(config)), flush=True)
        supervisor = Supervisor(started, args.max_restarts, args.restart_window_s, sys.stderr)
        while True:
            supervisor.check(time.monotonic())
            time.sleep(0.2)
    except CrashLoop as exc:
        _ignore_ending_signals()
        print(f"luftpause up: {exc}", file=sys.stderr, flush=True)
        return 1
    except _Stop:
        print("stopping ...", flush=True)
        return 0
    except RuntimeError as exc:  # a child failed to become ready
        _ignore_ending_signals()
        print(f"luftpause up: {exc}", file=sys.stderr)
        return 1
    finally:
        _ignore_ending_signals()
        for child in reversed(started):
            child.stop()
