"""``luftpause scheduler``: the gRPC admission service and the HTTP status endpoint, one process.

Both servers, the 1 s clock tick and the 2 s engine probes (:mod:`.probes`) share one uvloop event
loop and one :class:`SchedulerHost`. SIGHUP re-reads the configuration file and applies its
``[[replicas]]`` (added, removed, drained: :meth:`SchedulerHost.reload`). SIGINT or SIGTERM stops
them (dataplanes' ``Connect`` streams end with UNAVAILABLE, which abandons the admissions still
held on them; the dataplanes hold those turns and re-send them to whichever scheduler comes back)
and the process exits 0. A bad configuration prints the
:class:`~luftpause.config.ConfigError` and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import grpc
import uvloop
from aiohttp import web

from luftpause.auth.grpc_link import server_interceptors
from luftpause.auth.hosts import HostAllowList
from luftpause.auth.tls import check_listener, grpc_server_credentials, server_context
from luftpause.auth.tokens import TOKEN_ENV, token_from_env
from luftpause.config import Config, ConfigError, load_config, split_host_port
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.observe import logs, tracing
from luftpause.scheduler.discovery import Discovery
from luftpause.scheduler.errors import CannotListen
from luftpause.scheduler.grpc_service import SchedulerService
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.probes import Prober
from luftpause.scheduler.status_http import status_app
from luftpause.serving.listeners import start_aiohttp_site
from luftpause.serving.ports import refuse_if_in_use
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

log = logging.getLogger("luftpause.scheduler")

STOP_GRACE_S = 1.0

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest gRPC message either way. A resync (the first message of a ``Connect`` stream) carries
every run of a dataplane's last 30 min (run ids up to 256 bytes, callers up to 128): far past
gRPC's default 4 MiB receive limit, which would refuse the resync and keep that dataplane from ever
admitting again."""

GRPC_SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A dataplane pings every 10 s (grpc.keepalive_time_ms) and keeps its Connect stream open for
    # good, often with no data moving. gRPC's server defaults count a ping that comes sooner than
    # 5 min after the last one (2 h when no call is open) as a strike, and after 2 strikes answer
    # GOAWAY ENHANCE_YOUR_CALM "too_many_pings", dropping the dataplane's link. Dataplanes are our
    # own peers: their pings are welcome with or without calls, ...
    ("grpc.keepalive_permit_without_calls", 1),
    # ... every 5 s is no strike at all (core's GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS) ...
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    # ... and faster ones (a dataplane configured otherwise) never cost the link: 0 strikes = no limit
    ("grpc.http2.max_ping_strikes", 0),
    # gRPC binds with SO_REUSEPORT by default: a second scheduler on the same port would start and
    # the kernel would split dataplanes between two unrelated placement states.
    ("grpc.so_reuseport", 0),
]
"""Channel arguments of the scheduler's gRPC server (gRPC core's doc/keepalive.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``."""
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, 2 on a bad configuration, 1 if a port is taken."""
    config = config_from_args(args)
    try:
        check_listener(config.scheduler.tls, "scheduler.tls")
    except ConfigError as exc:
        print(f"luftpause scheduler: {exc}", file=sys.stderr)
        return 2
    refuse_if_in_use("scheduler", config.scheduler.grpc)
    refuse_if_in_use("scheduler", config.scheduler.http)
    tracing.setup(tracing.SCHEDULER_SERVICE)  # admit spans, when OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        uvloop.run(serve(config))
    except OSError as exc:
        logs.announce("scheduler", f"luftpause scheduler: {exc}", level=logging.ERROR, stream=sys.stderr)
        return 1
    finally:
        tracing.shutdown()  # export what is buffered
    return 0


async def serve(config: Config, stop: asyncio.Event | None = None) -> None:
    """Run the scheduler on ``config.scheduler.grpc`` and ``.http`` until ``stop`` is set (or a signal)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    host = SchedulerHost(config)
    prober = Prober(config, host)
    token = token_from_env()
    if token is None:
        log.warning("%s is not set: the gRPC link and GET /status accept every client", TOKEN_ENV)
    grpc_server = grpc.aio.server(options=GRPC_SERVER_OPTIONS, interceptors=server_interceptors(token))
    discovery = Discovery(host, config.scheduler.discovery) if config.scheduler.discovery else None
    if config.source is not None:
        loop.add_signal_handler(signal.SIGHUP, reload_replicas, host, config.source, discovery)
    pb_grpc.add_SchedulerServicer_to_server(SchedulerService(host), grpc_server)
    http_host, http_port = split_host_port(config.scheduler.http)
    hosts = HostAllowList(http_host, config.scheduler.allowed_hosts)
    limits = config.scheduler.limits
    runner = web.AppRunner(
        status_app(host, token, hosts, limits), access_log=None, shutdown_timeout=limits.stop_timeout_s
    )
    await runner.setup()
    tls = config.scheduler.tls
    site: asyncio.AbstractServer | None = None
    discovering: asyncio.Task[None] | None = None
    try:
        try:
            if tls is None:
                bound = grpc_server.add_insecure_port(config.scheduler.grpc)
            else:
                bound = grpc_server.add_secure_port(
                    config.scheduler.grpc, grpc_server_credentials(tls, "scheduler.tls")
                )
        except RuntimeError as exc:
            raise CannotListen(f"cannot listen for gRPC on {config.scheduler.grpc}: {exc}") from None
        if bound == 0:
            raise CannotListen(f"cannot listen for gRPC on {config.scheduler.grpc}")
        await grpc_server.start()
        context = server_context(tls, "scheduler.tls") if tls is not None else None
        site = await start_aiohttp_site(runner, http_host, http_port, limits, context)
        host.start_clock()
        prober.start()
        discovering = loop.create_task(discovery.run(stop=stop)) if discovery is not None else None
        logs.announce(
            "scheduler",
            f"luftpause scheduler: gRPC on {config.scheduler.grpc}{' (TLS)' if tls else ''}, "
            f"status on {'https' if tls else 'http'}://{config.scheduler.http}/status",
            stream=sys.stderr,
        )
        await stop.wait()
    finally:
        if discovering is not None:
            discovering.cancel()
            await asyncio.gather(discovering, return_exceptions=True)
        await prober.stop()
        host.stop_clock()
        await grpc_server.stop(STOP_GRACE_S)
        if site is not None:
            site.close()
        await runner.cleanup()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)


def reload_replicas(host: SchedulerHost, path: str, discovery: Discovery | None = None) -> None:
    """``SIGHUP``: re-read ``path`` and apply its ``[[replicas]]`` (:meth:`SchedulerHost.reload`),
    keeping the replicas ``discovery`` found (they are not in the file).

    A file that cannot be read or is refused changes nothing (the error is logged); other settings
    are read at start only.
    """
    try:
        config = load_config(path)
    except ConfigError as exc:
        log.error("SIGHUP: configuration not reloaded: %s", exc)
        return
    if discovery is not None:
        found = tuple(host.replicas[name] for name in sorted(discovery.discovered) if name in host.replicas)
        config = config.model_copy(update={"replicas": (*config.replicas, *found)})
    done = host.reload(config)
    log.warning("SIGHUP: replicas reloaded from %s: %s", path, "; ".join(done) or "no change")
