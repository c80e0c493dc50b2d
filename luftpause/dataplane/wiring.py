"""The dataplane's object graph, built in one place, in dependency order.

:func:`build_dataplane` makes every part and hands each the parts it uses when it is constructed;
nothing is assigned to a part from outside afterwards (no callback set later: the link is given
what it calls when it is built). The order, each line using only what is above it::

    runs         the run table (phases, in-flight turns; what a resync carries)    runs.py
                 (this worker's ``dataplane_id`` on the link: worker_dataplane_id)
    tool_calls   the ``tool_call_id -> run`` table (Cython or its twin)   luftpause/tool_calls/
    ended_runs   runs ended by ``DELETE /v1/runs/{id}``
    identity     which run a turn belongs to      (runs, tool_calls, ended_runs)   intake/run_identity.py
    access       who may use the ``/v1`` routes, as which caller                   auth/callers.py
    replicas     the replicas as the scheduler last said, and what derives from them  link/replicas.py
    intake       what a request becomes           (access, identity, replicas' token caps)  intake/turns.py
    metrics      what ``/metrics`` serves (its gauges handed in at each scrape)     observe/metrics.py
    link         the scheduler link     (runs; metrics' held times, replicas.learn) link/admission.py
    placement    a turn's admission     (link, runs, metrics)                      link/placement.py
    upstream     the engine connections                                            relay/upstream/
    relay        forward and relay a turn   (upstream, link, runs, metrics, tool_calls)  relay/loop.py
    turns        one turn's life, raced against its client  (placement, relay, replicas)  server/turns.py
    app          the ASGI application and its route table  (all of the above)      server/app.py

Every part that keeps time is given ``clock`` (seconds, monotonic): the run table's writers (the
intake, the relay, the pruning) must read one clock.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from luftpause.auth.callers import Access
from luftpause.auth.grpc_link import LinkCredentials
from luftpause.config import Config, load_config, split_host_port
from luftpause.dataplane.intake.run_identity import RunIdentity
from luftpause.dataplane.intake.turns import TurnIntake
from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.link.placement import Placement
from luftpause.dataplane.link.replicas import Replicas
from luftpause.dataplane.observe.metrics import DataplaneMetrics
from luftpause.dataplane.relay.loop import Relay
from luftpause.dataplane.relay.upstream import Upstream
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.server.app import Dataplane
from luftpause.dataplane.server.turns import TurnRunner
from luftpause.observe import tracing
from luftpause.serving.ports import hold_worker_slot
from luftpause.tool_calls import ToolCallTable
from luftpause.v1.contract import TURN_EXPIRY_S

__all__ = [
    "ENGINE_READ_TIMEOUT_ENV",
    "PRUNE_EVERY_S",
    "build_dataplane",
    "configured_callers",
    "create_app",
    "dataplane_id_base",
    "worker_dataplane_id",
]

ENGINE_READ_TIMEOUT_ENV = "LUFTPAUSE_ENGINE_READ_TIMEOUT_S"
"""Overrides the engine read timeout (seconds), for tests; by default the scheduler's turn expiry."""
PRUNE_EVERY_S = 60.0
"""How often expired runs, tool-call ids and ended runs are forgotten (one task for all three); a
sixth of ``[dataplane] run_expiry_s`` when that is shorter."""


def configured_callers(config: Config, access: Access) -> list[str]:
    """The callers the configuration names: the caller keys' and ``[scheduler.protection]
    callers``; their roots are the caller labels of the metrics and the usage."""
    keyed = access.keys.callers if access.keys is not None else []
    return [*keyed, *config.scheduler.protection.callers]


def dataplane_id_base(config: Config) -> str:
    """The dataplane id of a dataplane of one worker, ``dp-<host>-<listen>``: stable across
    restarts on the same host and address, so the resync of a restarted dataplane releases what
    the crashed one held."""
    return f"dp-{socket.gethostname()}-{config.dataplane.listen}"


def worker_dataplane_id(config: Config) -> str:
    """This worker's dataplane id: :func:`dataplane_id_base`, and with ``[dataplane] workers``
    above 1 ``-w<N>``, N the worker's number (:func:`luftpause.serving.ports.hold_worker_slot`:
    distinct among the living workers, the same for a worker replacing a dead one), or
    ``-p<pid>`` when no number freed up in time (distinct still, not stable)."""
    base = dataplane_id_base(config)
    workers = config.dataplane.workers
    if workers <= 1:
        return base
    slot = hold_worker_slot("dataplane", config.dataplane.listen, workers)
    return f"{base}-w{slot}" if slot is not None else f"{base}-p{os.getpid()}"


def build_dataplane(
    config: Config, dataplane_id: str | None = None, clock: Callable[[], float] = time.monotonic
) -> Dataplane:
    """The dataplane of ``config``, every part built and given what it uses (the order in the
    module docstring); ``dataplane_id``: this worker's on the scheduler link (by default the one
    of a dataplane of one worker, :func:`dataplane_id_base`). Nothing starts here: the app's
    lifespan starts the link, the engine connections' sweep and the pruning, inside the worker's
    loop."""
    settings = config.dataplane
    expiry_s = settings.run_expiry_s
    runs = RunTable(idle_expiry_s=expiry_s)
    tool_calls = ToolCallTable(ttl_s=expiry_s)
    ended_runs: dict[str, float] = {}
    identity = RunIdentity(runs, tool_calls, ended_runs)
    access = Access.from_config(config)
    replicas = Replicas(config.replicas, settings.max_tokens)
    intake = TurnIntake(access, identity, clock, replicas.token_cap)
    metrics = DataplaneMetrics(
        replicas=[replica.name for replica in config.replicas],
        callers=configured_callers(config, access),
        usage_window_s=settings.usage_window_s,
    )
    link = SchedulerLink(
        settings.scheduler,
        runs,
        dataplane_id or dataplane_id_base(config),
        credentials=LinkCredentials.from_config(config),
        idle_affinity=config.scheduler.idle_affinity != "off",
        on_placed=metrics.placed,  # turns that waited for a decision, not leased ones
        on_replicas=replicas.learn,  # the scheduler's set replaces the file's
    )
    placement = Placement(link, runs, metrics)
    # No total timeout: a stream lasts as long as the engine generates. But an engine silent for as
    # long as the scheduler keeps a placed turn (TURN_EXPIRY_S) has failed the turn: the scheduler
    # has dropped it by then, so it is answered 502 (or its stream is broken).
    upstream = Upstream(float(os.environ.get(ENGINE_READ_TIMEOUT_ENV) or TURN_EXPIRY_S))
    relay = Relay(upstream, link, runs, metrics, tool_calls, settings.failover, clock)
    turns = TurnRunner(
        placement, relay, metrics, replicas, settings.failover, split_host_port(settings.listen)
    )
    return Dataplane(
        runs=runs,
        tool_calls=tool_calls,
        ended_runs=ended_runs,
        access=access,
        intake=intake,
        replicas=replicas,
        link=link,
        placement=placement,
        upstream=upstream,
        relay=relay,
        turns=turns,
        metrics=metrics,
        clock=clock,
        prune_every_s=min(PRUNE_EVERY_S, expiry_s / 6),
    )


def create_app(config: Config | None = None) -> Dataplane:
    """Build the app from ``config``, else from ``LUFTPAUSE_CONFIG`` (or the embedded default) and
    the environment (:func:`luftpause.config.load_config`); granian's loader.

    Runs in the worker process, so that is where spans are exported from when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (:func:`luftpause.observe.tracing.setup`).
    """
    tracing.setup(tracing.DATAPLANE_SERVICE)
    config = config if config is not None else load_config()
    return build_dataplane(config, worker_dataplane_id(config))
