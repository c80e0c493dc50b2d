"""The runtime's object graph, built in one place, in dependency order.

:func:`build_runtime` makes every part and hands each the parts it uses when it is constructed;
nothing is assigned to a part from outside afterwards. The order, each line using only what is
above it::

    journal        runs.jsonl, or the runs' records in PostgreSQL      runs/store.py
    changes        the run network's change counter                   runs/changes.py
    scopes         the scope ledger                (journal, changes)  pods/scopes.py
    notifications  spawners' events, inboxes' senders  (")            pods/notifications.py
    tree           depths and children limits          (")            pods/tree.py
    registry       every run and its task   (journal, changes, listeners: the three above)
    upstream       the upstream MCP tool servers                      agent/upstream.py
    dataplane      the one dataplane client (``transport``: a test's)  dataplane.py
    approvals      the approval gate and its answers  (registry, upstream)
    spawner        the one spawn path      (registry, upstream, scopes, tree, instructions)
    pods           send/read/stop/list     (registry, scopes, notifications, tree)
    builtins       a sub-agent's own tools (scopes, pods, spawner)
    loop           drives runs  (registry, dataplane, upstream, approvals, notifications, builtins, scopes)
    decider        ``decide``              (dataplane)
    router         on a shared store: forwards calls about other runtimes' runs  (registry)
    tasks          the Tasks extension's tasks   (registry, approvals, run's result renderer;
                   on a shared store the tasks' records of other runtimes)
    mcp            the MCP server, its tools and the Tasks extension  (all of the above)
    series         the monitor's runs by state over the last minutes  (registry)  runs/series.py

A sub-agent's own ``spawn`` is then a path the imports show: the loop calls its built-in tools,
which call the spawner, which adds the run to the registry and starts it; the registry drives
every run with the loop's ``drive``, which it is given when it starts serving
(:meth:`Runtime.serving`).

:meth:`Runtime.serving` is the lifespan of everything that outlives a request, in this order: the
upstream MCP clients, the dataplane client, the run registry (which replays the journal and resumes
the unfinished runs), the sampling of the monitor's series, the task registry (``tasks.jsonl``;
tasks open at the last stop are failed) and the SDK's session manager. On shutdown they are left in
reverse: the registry cancels the runs still going without journaling an end for them, so they
resume on the next start. They are deliberately *not* ended at the dataplane: the scheduler keeps
their affinity (last replica, prefix cache) and, for a run paused on a tool, its headroom slot
until the runtime is back (or its 30 min run idle expiry, if it never comes back). A run the
shutdown interrupts is therefore treated exactly like one a crash interrupts. Only a registry
without a journal (none is built so here) would end its interrupted runs at the dataplane, in one
bounded step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp.server import MCPServer

from luftpause.auth.tls import client_context
from luftpause.config import Config, split_host_port
from luftpause.runtime.agent.approvals import Approvals
from luftpause.runtime.agent.loop import SubAgentLoop
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.dataplane import DataplaneClient, RetryPolicy
from luftpause.runtime.decide import Decider
from luftpause.runtime.mcp.pod_tools import PodTools
from luftpause.runtime.mcp.routing import Router
from luftpause.runtime.mcp.run_tools import RunTools
from luftpause.runtime.mcp.server import build_mcp_server
from luftpause.runtime.mcp.spawn_tools import SpawnTools, render_run_result
from luftpause.runtime.mcp.tasks import SharedTaskRecords, TaskRegistry
from luftpause.runtime.mcp.tasks_extension import TasksExtension
from luftpause.runtime.pods.notifications import Notifications
from luftpause.runtime.pods.operations import PodOperations
from luftpause.runtime.pods.scopes import RunScopes
from luftpause.runtime.pods.tree import TreeLimits
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.series import RunSeries
from luftpause.runtime.runs.store import RecordStore, open_stores
from luftpause.runtime.runs.tenants import Tenant, visible
from luftpause.runtime.spawn.builtin_tools import BuiltinTools
from luftpause.runtime.spawn.instructions import Instructions
from luftpause.runtime.spawn.spawner import Spawner

log = logging.getLogger("luftpause.runtime")


def generative_models(config: Config) -> list[str]:
    """The models a sub-agent can run on: those of generative replicas, in configuration order
    (a single-pass replica cannot answer a chat turn)."""
    return list(dict.fromkeys(m for r in config.replicas if r.kind == "generative" for m in r.models))


@dataclass(eq=False)
class Runtime:
    """Every part of one runtime process (module docstring), as :func:`build_runtime` made them."""

    config: Config
    token: str | None
    journal: RecordStore
    changes: NetworkChanges
    scopes: RunScopes
    notifications: Notifications
    tree: TreeLimits
    registry: RunRegistry
    upstream: UpstreamPool
    dataplane: DataplaneClient
    approvals: Approvals
    spawner: Spawner
    pods: PodOperations
    builtins: BuiltinTools
    loop: SubAgentLoop
    decider: Decider
    tasks: TaskRegistry
    mcp: MCPServer
    series: RunSeries

    @property
    def mcp_url(self) -> str:
        host, port = split_host_port(self.config.runtime.listen)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/mcp"

    def status(self, tenant: Tenant | None = None) -> dict[str, Any]:
        """``GET /status``: ``{"runs": RunRegistry.tree(tenant), "upstream": [UpstreamPool.describe()
        item], "journal": JournalReport.to_json()}`` for a request of ``tenant`` (``None``: no
        caller keys; another tenant's runs are left out, and so are they from the journal
        section's handles); each run's task is summarized
        (:func:`luftpause.runtime.runs.record.summarize`)."""
        journal = self.registry.journal_report.to_json()
        if tenant is not None and not tenant.admin:
            for field in ("runsPossiblyLost", "runsLost"):
                journal[field] = [h for h in journal[field] if self._sees(h, tenant)]
        return {
            "runs": self.registry.tree(tenant),
            "upstream": self.upstream.describe(),
            "journal": journal,
        }

    def _sees(self, handle: str, tenant: Tenant) -> bool:
        run = self.registry.find(handle)
        return run is not None and visible(run, tenant)

    @asynccontextmanager
    async def serving(self, *, with_mcp_sessions: bool = True) -> AsyncIterator[Runtime]:
        """Everything that outlives a request, entered in order and left in reverse (module
        docstring). ``with_mcp_sessions``: also run the SDK's session manager (needed when the
        SDK's HTTP app serves ``/mcp``; an in-process ``mcp.Client(runtime.mcp)`` needs none)."""
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self.upstream)
            await stack.enter_async_context(self.dataplane)

            async def end_interrupted_runs() -> None:
                # Runs after the registry has stopped every run, while the dataplane client is
                # still open. With a journal (always, here) the list is empty: those runs resume.
                handles = [run.handle for run in self.registry.unresumable_interrupted]
                ended = await self.dataplane.end_runs(handles)
                if handles:
                    log.info("shutdown: %d of %d stopped runs ended at the dataplane", ended, len(handles))

            # Pushed before the registry is entered, so it is called after the registry is left.
            stack.push_async_callback(end_interrupted_runs)
            await stack.enter_async_context(self.registry.serving(self.loop.drive))
            await stack.enter_async_context(self.series.sampling())  # the monitor's last minutes
            # Entered after the runs, so left before them: a task open at shutdown stays open.
            await stack.enter_async_context(self.tasks)
            if with_mcp_sessions:
                await stack.enter_async_context(self.mcp.session_manager.run())
            yield self


def _router(journal: RecordStore, registry: RunRegistry) -> Router | None:
    """The router of calls about runs other runtimes hold: only on a shared PostgreSQL store."""
    database = getattr(journal, "database", None)
    if database is None or getattr(database, "custody", None) is None:
        return None
    return Router(registry, database)


def build_runtime(
    config: Config,
    token: str | None = None,
    *,
    transport: httpx2.AsyncBaseTransport | None = None,
    retention_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Runtime:
    """The runtime of ``config`` (module docstring), not yet serving. ``token`` is the shared
    ``LUFTPAUSE_TOKEN`` its requests to the dataplane carry; ``transport`` replaces the network
    between the runtime and its dataplane (tests: an ``httpx2.MockTransport``); ``retention_seconds``
    and ``clock`` are the run registry's (tests; ``retention_seconds`` else ``[runtime]
    retained_s``)."""
    settings = config.runtime
    if retention_seconds is None:
        retention_seconds = settings.retained_s
    stores = open_stores(settings)
    journal = stores.runs
    changes = NetworkChanges()
    scopes = RunScopes(config, journal, changes)
    notifications = Notifications(journal, changes)
    tree = TreeLimits(settings.max_depth, settings.max_children, journal, changes)
    registry = RunRegistry(
        store=journal,
        changes=changes,
        listeners=(scopes, notifications, tree),
        retained_bytes=settings.retained_bytes,
        retention_seconds=retention_seconds,
        clock=clock,
    )
    upstream = UpstreamPool(config.mcp_servers)
    # The runtime's own turns carry its caller key when it has one ([runtime] dataplane_key_env),
    # over TLS as [runtime.dataplane_tls] says for an https:// dataplane.
    peer = settings.dataplane_tls
    dataplane = DataplaneClient(
        settings.dataplane,
        settings.dataplane_key() or token,
        transport=transport,
        verify=client_context(peer, "runtime.dataplane_tls") if peer is not None else True,
        retry=RetryPolicy(seconds=settings.turn_retry_seconds, max_wait=settings.turn_retry_max_wait),
    )
    approvals = Approvals(registry, upstream)
    models = generative_models(config)
    spawner = Spawner(
        registry=registry,
        upstream=upstream,
        scopes=scopes,
        tree=tree,
        instructions=Instructions(settings.instructions_dir),
        models=models,
        default_model=config.default_model,
    )
    pods = PodOperations(registry, scopes, notifications, tree)
    builtins = BuiltinTools(scopes, pods, spawner)
    loop = SubAgentLoop(
        registry,
        dataplane,
        upstream,
        approve=approvals.gate,
        arrivals=notifications,
        builtins=builtins,
        path_check=scopes,
    )
    decider = Decider(dataplane)
    router = _router(journal, registry)
    shared = isinstance(stores.tasks, SharedTaskRecords) and stores.tasks.shared
    tasks = TaskRegistry(
        stores.tasks,
        registry,
        approvals,
        render_run_result,
        retention_seconds=retention_seconds,
        shared=stores.tasks if shared and isinstance(stores.tasks, SharedTaskRecords) else None,
    )
    mcp = build_mcp_server(
        spawn_tools=SpawnTools(
            spawner=spawner, registry=registry, approvals=approvals, notifications=notifications, tasks=tasks
        ),
        run_tools=RunTools(
            config=config,
            registry=registry,
            approvals=approvals,
            notifications=notifications,
            pods=pods,
            upstream=upstream,
            builtins=builtins,
            decider=decider,
            models=models,
        ),
        pod_tools=PodTools(pods),
        extensions=[TasksExtension(tasks, router)],
        router=router,
    )
    return Runtime(
        config=config,
        token=token,
        journal=journal,
        changes=changes,
        scopes=scopes,
        notifications=notifications,
        tree=tree,
        registry=registry,
        upstream=upstream,
        dataplane=dataplane,
        approvals=approvals,
        spawner=spawner,
        pods=pods,
        builtins=builtins,
        loop=loop,
        decider=decider,
        tasks=tasks,
        mcp=mcp,
        series=RunSeries(registry),
    )
