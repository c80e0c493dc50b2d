"""Shared helpers of the runtime's tests: a bare run record, a minimal configuration and one with
its own state directory, a registry entered on a journal, one ASGI request, and a whole stack with
a second tool server serving a destructive tool."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postgres_helpers import store_line
from starlette.types import ASGIApp, Message

from luftpause.config import DEFAULT_MODEL, Config, parse_config
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.pods.notifications import Notifications
from luftpause.runtime.pods.operations import PodOperations
from luftpause.runtime.pods.scopes import RunScopes
from luftpause.runtime.pods.tree import TreeLimits
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.journal import JOURNAL_NAME, Journal
from luftpause.runtime.runs.postgres import PostgresDatabase
from luftpause.runtime.runs.record import Costs, Run
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.spec import RunSpec
from luftpause.runtime.runs.store import RecordStore, encode
from luftpause.runtime.spawn.builtin_tools import BuiltinTools
from luftpause.runtime.spawn.instructions import Instructions
from luftpause.runtime.spawn.spawner import Spawner
from luftpause.runtime.wiring import generative_models
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

COST_FIELDS = frozenset(f.name for f in dataclasses.fields(Costs))

MINIMAL_CONFIG = parse_config(
    f"""
[runtime]
listen = "127.0.0.1:7999"
dataplane = "http://127.0.0.1:9"

[[replicas]]
name = "sim"
url = "http://127.0.0.1:9"
models = ["{DEFAULT_MODEL}"]
"""
)
"""A runtime's configuration with one replica, for tests that never reach the dataplane or the
engine (both at 127.0.0.1:9, where nothing answers); its state directory is the default."""


def make_run(handle: str, **overrides: Any) -> Run:
    """A :class:`Run` with test defaults (batch, 8 tool calls, 256 tokens, caller ``tester``);
    ``overrides`` win: spec fields (``task``, ``max_tool_calls``, ``parent``, ..., and
    ``allowed_tools`` for ``tools``), cost counters (``turns``, ``prompt_tokens``, ...) and the
    run's own fields (``messages``, ``state``, ...). The spec is taken as given, unvalidated (a
    test may hold values no spawn would accept)."""
    spec: dict[str, Any] = {
        "task": "t",
        "model": DEFAULT_MODEL,
        "service_class": "batch",
        "caller": "tester",
        "max_tool_calls": 8,
        "max_tokens": 256,
    }
    costs: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "allowed_tools":
            spec["tools"] = sorted(value) if value is not None else None
        elif key == "approve_tools":
            spec["approve_tools"] = sorted(value)
        elif key in RunSpec.model_fields:
            spec[key] = value
        elif key in COST_FIELDS:
            costs[key] = value
        else:
            own[key] = value
    made = RunSpec.model_construct(**spec)
    if "messages" in own:
        return Run(handle=handle, spec=made, costs=Costs(**costs), **own)
    return Run.new(handle, made, costs=Costs(**costs), **own)


def with_state_dir(config: Config, state_dir: Path) -> Config:
    """``config`` with ``[runtime] state_dir`` set to ``state_dir``, so a test's journal never
    lands in the working directory."""
    runtime = config.runtime.model_copy(update={"state_dir": str(state_dir)})
    return config.model_copy(update={"runtime": runtime})


async def replay_into_registry(
    state_dir: Path, store: str = "file", **journal: Any
) -> tuple[RunRegistry, list[Run]]:
    """Enter a registry on the store ``store`` (:func:`open_store`; ``journal``: its keywords)
    and resume its runs with a loop that never finishes; the registry (left again) and the runs it
    resumed."""
    resumed: list[Run] = []

    async def idle(run: Run) -> None:
        resumed.append(run)
        await asyncio.Event().wait()

    registry = RunRegistry(store=open_store(store, state_dir, **journal))
    async with registry.serving(idle):
        await asyncio.sleep(0)
    return registry, resumed


async def asgi_request(
    app: ASGIApp, method: str, path: str
) -> tuple[int, dict[str, str], bytes, Exception | None]:
    """One HTTP request through ``app`` in-process: (status, headers, body, what the app raised)."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:7999")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 7999),
    }
    raised: Exception | None = None
    try:
        await app(scope, receive, send)
    except Exception as exc:  # Starlette re-raises after answering 500, for the server's log
        raised = exc
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body, raised


@contextmanager
def destructive_tools(workdir: Path, name: str = "fake-mcp") -> Iterator[str]:
    """A fake MCP server that also serves ``delete_note`` (``destructiveHint: true``: its calls
    wait for a person's approval), on a free port, its log ``<name>.log`` in ``workdir``: yields
    its MCP URL; stops it."""
    port = free_port()
    server = ChildProcess(
        name,
        ["fake-mcp", "--port", str(port), "--destructive"],
        workdir / f"{name}.log",
        ready_port=("127.0.0.1", port),
    )
    try:
        server.start().wait_ready()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.stop()


@contextmanager
def stack_with_destructive_tools(workdir: Path, store: str = "file") -> Iterator[tuple[Stack, str]]:
    """The whole stack plus a second fake MCP server, ``danger``, that also serves ``delete_note``
    (``destructiveHint: true``): yields the stack and that server's MCP URL; stops both. ``store``:
    the runtime's ``[runtime] store`` (``"file"``, or a PostgreSQL URL)."""
    with destructive_tools(workdir, "danger") as url:
        extra = f"""
[[mcp_servers]]
name = "danger"
url = "{url}"
"""
        sections = {"runtime": store_line(store)}
        stack = Stack.start(workdir, extra_config=extra, env={"LUFTPAUSE_TOKEN": ""}, sections=sections)
        try:
            yield stack, url
        finally:
            stack.stop()


@dataclass
class Parts:
    """The runtime's parts that need no network, built as
    :func:`luftpause.runtime.wiring.build_runtime` builds them, over a registry that may have no
    journal (runs are added and finished by hand; nothing drives them)."""

    registry: RunRegistry
    scopes: RunScopes
    notifications: Notifications
    tree: TreeLimits
    pods: PodOperations
    spawner: Spawner
    builtins: BuiltinTools


def parts_over(config: Config, **registry_options: Any) -> Parts:
    """:class:`Parts` of ``config``; ``registry_options`` go to the :class:`RunRegistry`
    (``store``, ``retained_bytes``, ...; no store by default)."""
    journal = registry_options.get("store")
    changes = NetworkChanges()
    scopes = RunScopes(config, journal, changes)
    notifications = Notifications(journal, changes)
    tree = TreeLimits(config.runtime.max_depth, config.runtime.max_children, journal, changes)
    registry = RunRegistry(changes=changes, listeners=(scopes, notifications, tree), **registry_options)
    pods = PodOperations(registry, scopes, notifications, tree)
    spawner = Spawner(
        registry=registry,
        upstream=UpstreamPool(config.mcp_servers),
        scopes=scopes,
        tree=tree,
        instructions=Instructions(config.runtime.instructions_dir),
        models=generative_models(config),
        default_model=config.default_model,
    )
    return Parts(registry, scopes, notifications, tree, pods, spawner, BuiltinTools(scopes, pods, spawner))


def pods_over(config: Config, **registry_options: Any) -> PodOperations:
    """The pod operations of :func:`parts_over`; the registry is ``pods.registry``."""
    return parts_over(config, **registry_options).pods


def open_store(store: str, state_dir: Path, **options: Any) -> RecordStore:
    """The runs' store a runtime with ``[runtime] store = store`` and ``state_dir`` opens
    (``options``: ``compact_bytes``): the file journal, or the ``runs`` stream of the database."""
    if store == "file":
        return Journal(state_dir, **options)
    return PostgresDatabase(store, retry_seconds=30).journal("runs", **options)


def with_store(config: Config, store: str, state_dir: Path) -> Config:
    """``config`` with ``[runtime] store`` and ``state_dir`` set (:func:`with_state_dir`)."""
    config = with_state_dir(config, state_dir)
    runtime = config.runtime.model_copy(update={"store": store})
    return config.model_copy(update={"runtime": runtime})


def seed_store(store: str, state_dir: Path, records: list[dict[str, Any]]) -> None:
    """Make the store hold exactly ``records``, as a runtime that wrote them and stopped left it
    (the file journal: one JSON line each; PostgreSQL: one row each)."""
    if store == "file":
        path = state_dir / JOURNAL_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(encode(record) for record in records))
        return
    open_store(store, state_dir).compact(records)


def stored(store: str, state_dir: Path) -> list[dict[str, Any]]:
    """Every record the store holds, in order."""
    return list(open_store(store, state_dir).records())


def stored_bytes(store: str, state_dir: Path) -> int:
    """The bytes the store's records take as journal lines (the size compaction is measured in)."""
    return sum(len(encode(record)) for record in stored(store, state_dir))
