"""One typed configuration for all three processes.

The file is TOML (``--config FILE`` or ``LUFTPAUSE_CONFIG``); its shape is the one in docs/architecture.md
("Configuration"). With no file the embedded default below is used: two simulated replicas serving
one model and the fake MCP tool server, all on loopback, which ``luftpause up`` starts itself.

A bad file is refused with :class:`ConfigError`, whose message names the file, the key and what was
expected, in TOML's words (array, table, true or false), for example::

    luftpause.toml: replicas[0].kind: expected 'generative' or 'single_pass', got 'gpu'
    luftpause.toml: replicas[0].models: expected an array, got 'm'
    luftpause.toml: colour: unknown key

Unknown keys are refused at every level, the top level included.

Every key of a table (``[scheduler]``, ``[dataplane]``, ``[runtime]``) can also be set by an
environment variable, and a few by a flag: flag > environment variable > file > default
(:mod:`luftpause.config.settings` has the naming rule, ``LUFTPAUSE_DATAPLANE__LISTEN``). Their bad values
are refused the same way, naming the variable or the flag instead of the file's key::

    LUFTPAUSE_SCHEDULER__STRICT_AFFINITY: expected true or false, got 'maybe'
    --listen: expected 'host:port', got '8080'

A key's attribute docstring is its description (pydantic's ``use_attribute_docstrings``): the
processes' ``--help`` lists it, so every key has one.

The package's parts: :mod:`.tables` (the base of every table and the sub-tables), :mod:`.faults`
(a configuration's faults in TOML's words), :mod:`.settings` (every key as an environment variable,
a help line and a flag), :mod:`.arguments` (``--config`` and the setting flags every process
takes) and :mod:`.check` (``luftpause check-config``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from luftpause.config.faults import arrays_as_tuples, describe_layered, fault_lines
from luftpause.config.settings import KeyPath, Layer, from_environment, from_flags, merge
from luftpause.config.tables import (
    ConfigError,
    DiscoveryConfig,
    FailoverConfig,
    FrontDoorApi,
    LimitsConfig,
    ListenerLimits,
    ProtectionConfig,
    Section,
    TlsListener,
    TlsPeer,
    host_port,
    http_url,
    without_password,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_MODEL",
    "EMBEDDED_DEFAULT",
    "READ_BY",
    "Config",
    "ConfigError",
    "DataplaneConfig",
    "DiscoveryConfig",
    "EnginePriority",
    "FailoverConfig",
    "FrontDoorApi",
    "LimitsConfig",
    "ListenerLimits",
    "McpServerConfig",
    "ProtectionConfig",
    "ReplicaConfig",
    "RuntimeConfig",
    "SchedulerConfig",
    "Section",
    "TlsListener",
    "TlsPeer",
    "host_port",
    "http_url",
    "listen_url",
    "load_config",
    "parse_config",
    "split_host_port",
    "without_password",
]

CONFIG_ENV = "LUFTPAUSE_CONFIG"

EnginePriority = Literal["lower_first", "higher_first"]
"""How an engine orders its waiting queue by the request's ``priority`` field (``[[replicas]]
priority``): lower value first (vLLM) or higher value first (SGLang's default)."""

DEFAULT_MODEL = "llama-3.2-1b"

EMBEDDED_DEFAULT = f"""
[scheduler]
grpc = "127.0.0.1:5000"
http = "127.0.0.1:5001"

[dataplane]
listen = "127.0.0.1:8080"
scheduler = "127.0.0.1:5000"

[runtime]
listen = "127.0.0.1:7000"
dataplane = "http://127.0.0.1:8080"
state_dir = "state"

[[replicas]]
name = "sim-a"
url = "http://127.0.0.1:30001"
models = ["{DEFAULT_MODEL}"]

[[replicas]]
name = "sim-b"
url = "http://127.0.0.1:30002"
models = ["{DEFAULT_MODEL}"]

[[mcp_servers]]
name = "fake"
url = "http://127.0.0.1:7100/mcp"
"""


class SchedulerConfig(Section):
    grpc: str = "127.0.0.1:5000"
    """gRPC listen address (``host:port``) for Admit / Report / Resync."""
    http: str = "127.0.0.1:5001"
    """HTTP listen address (``host:port``) for ``GET /status``, the live page ``/``, ``/metrics``,
    ``/livez``, ``/readyz`` and ``/health``."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names (without port) the HTTP routes but ``/health`` answer for, besides the loopback
    names, IP addresses, this machine's host name and the ``http`` listen host: any other
    ``Host`` is refused 421, so a DNS-rebinding page cannot read ``/status``. ``["*"]``:
    any host (:mod:`luftpause.auth.hosts`)."""
    tls: TlsListener | None = None
    """TLS (and mutual TLS) on the gRPC port and the HTTP port."""
    limits: ListenerLimits = ListenerLimits()
    """Slow clients and connections at the HTTP port."""
    dataplane_grace_s: float = Field(default=60.0, gt=0)
    """Seconds a dataplane may be without a Connect stream before the turns placed for it are
    released (it is taken as gone for good); a reconnect or restart under the same id fits inside."""
    strict_affinity: bool = True
    """Keep a generating or tool-paused run on the replica that holds its prefix (the default).
    ``false`` lets every turn go anywhere: only for measuring what affinity gains."""
    idle_affinity: Literal["wait", "off", "prefer", "pin"] = "wait"
    """Where an idle run's next turn goes (a chat's next message, an agent whose tool calls the
    proxy does not see): ``wait`` (the default) to the replica that holds its prefix, held for it
    a bounded time learned from what a prefill miss costs (docs/architecture.md "Rules");
    ``off``, ``prefer`` (there only when it has room) and ``pin`` (until the window ends): for
    measuring. The dataplane reads it too, from its own file, for the placements it makes under a
    capacity lease: a dataplane on another host needs the same value in its ``[scheduler]`` table."""
    pause_hold: Literal["cost", "ttl", "pause", "off"] = "cost"
    """How long a tool-paused interactive run keeps a slot of its replica from batch turns:
    ``cost`` (the default) for the pause length that its caller's pauses say pays, the wait a
    return saves against the slot kept idle (docs/architecture.md "Rules"); ``ttl`` (twice the
    longest recent pause), ``pause`` (the whole pause) and ``off`` (no headroom): for measuring."""
    pause_hold_worth: float = Field(default=8.0, gt=0)
    """``cost``: slot-seconds of batch service one second of an interactive run's waiting is worth;
    larger holds longer (more interactive, less batch)."""
    kv_admission: bool = True
    """Start a run on a replica whose ``kv_tokens`` is set only while the runs in progress there fit
    its KV pool, and park runs whose tools outlive their caller's usual pause (docs/scheduling.md
    "KV-token admission"); ``false``: slots alone, for measuring."""
    kv_fill: float = Field(default=0.9, gt=0, le=1)
    """Share of a replica's ``kv_tokens`` that runs in progress may claim (the rest: the engine's
    room for decoding and the estimates' error)."""
    leases: bool = True
    """Grant dataplanes capacity leases while the pool is not saturated, so their turns skip the
    admission round trip (docs/architecture.md "Admission transport"); ``false``: every turn asks."""
    resync_hold_s: float = Field(default=2.0, ge=0)
    """Startup hold: for this many seconds after the scheduler starts, once a dataplane's resync
    shows a restart (it hands over runs or in-flight turns), no held turn is placed and no lease
    granted, so that the other dataplanes can resync their in-flight turns first and no replica
    is filled past its capacity; ``0``: none."""
    trace: str = ""
    """Record the arrivals, tool pauses and run ends the scheduler sees as JSON lines appended to
    this file (relative paths from the working directory), to replay them offline under another
    policy (``bench/flood_sim.py --replay``); ``""`` (the default): no trace."""
    protection: ProtectionConfig = ProtectionConfig()
    """Protection limits per caller and class, and the circuit breaker: opt-in, off by default."""
    run_expiry_s: float = Field(default=1800.0, gt=0)
    """Seconds with no turn after which the scheduler forgets a run (its affinity and headroom)."""
    discovery: DiscoveryConfig | None = None
    """Replicas discovered from the Kubernetes API by label selector (opt-in; docs/kubernetes.md)."""

    _check = field_validator("grpc", "http")(host_port)


MAX_DATAPLANE_WORKERS = 256
"""The most worker processes ``[dataplane] workers`` may ask for."""


class DataplaneConfig(Section):
    listen: str = "127.0.0.1:8080"
    """HTTP listen address (``host:port``) of the proxy: ``/v1``, ``/metrics``, ``/livez``, ``/readyz``,
    ``/health``."""
    scheduler: str = "127.0.0.1:5000"
    """Where the scheduler's gRPC endpoint is (``host:port``)."""
    caller_keys: str | None = None
    """A TOML file of caller keys (API keys, each mapped to a caller and the service classes it
    may use; :mod:`luftpause.auth.callers`), relative paths from the working directory. With
    keys (from this file or ``LUFTPAUSE_CALLER_KEYS``), the ``/v1`` routes take only them."""
    tls: TlsListener | None = None
    """TLS (and mutual TLS) on the HTTP listener."""
    limits: ListenerLimits = ListenerLimits()
    """Slow clients and connections at the HTTP listener."""
    scheduler_tls: TlsPeer | None = None
    """TLS on the link to the scheduler (for a scheduler with ``[scheduler.tls]``)."""
    run_expiry_s: float = Field(default=1800.0, gt=0)
    """Seconds the dataplane remembers an idle run, and the ``tool_call_id``s its turns emitted
    (how a turn without ``x-luftpause-run-id`` finds its run)."""
    max_tokens: dict[str, int] = Field(default_factory=dict)
    """Model -> the most tokens a turn may ask for (``max_tokens``, ``max_completion_tokens``,
    ``max_output_tokens``); more is refused 400. A model not named here is capped by the largest
    context length its replicas report (vLLM's and SGLang's ``max_model_len``), else not at all
    (docs/failover.md)."""
    failover: FailoverConfig = FailoverConfig()
    """Turns sent again to another replica when theirs failed before answering (docs/failover.md)."""
    workers: int = Field(default=1, ge=1, le=MAX_DATAPLANE_WORKERS)
    """Worker processes serving the proxy on ``listen`` (granian's workers; the kernel spreads
    connections among them, SO_REUSEPORT). Each keeps its own link to the scheduler under its own
    dataplane id (``dp-<host>-<listen>-w<N>``, N from 0); a turn that names no run and reaches
    another worker than its run's last is found on its run by the tool-call ids it answers,
    through the scheduler (docs/operating.md "Several workers and several dataplanes")."""
    usage_window_s: float = Field(default=3600.0, ge=1)
    """Seconds of one window of the token usage per caller and model that ``GET /status`` and
    ``GET /admin/usage`` show (the current window and the one before), aligned on the wall clock
    (3600: each hour from :00 UTC); docs/operating-metrics.md."""

    _check = field_validator("listen", "scheduler")(host_port)

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: dict[str, int]) -> dict[str, int]:
        for model, cap in value.items():
            if cap < 1:
                raise ValueError(f"expected a cap of at least 1 token, got {cap!r} for {model!r}")
        return value


class RuntimeConfig(Section):
    listen: str = "127.0.0.1:7000"
    """HTTP listen address (``host:port``) for ``/mcp``, ``/status``, ``/monitor``, ``/metrics``,
    ``/livez``, ``/readyz`` and ``/health``."""
    dataplane: str = "http://127.0.0.1:8080"
    """Base URL of the dataplane the sub-agents' turns go through."""
    state_dir: str = "state"
    """Where ``runs.jsonl`` lives; relative paths are taken from the working directory."""
    store: str = "file"
    """Where the runs are kept: ``"file"`` (``runs.jsonl`` and ``tasks.jsonl`` under
    ``state_dir``) or a PostgreSQL URL, ``postgresql://user:password@host:port/database``
    (the ``postgresql`` extra; several runtimes may share it; docs/runtime-store.md). Best given
    as ``LUFTPAUSE_RUNTIME__STORE``, from a secret; its password is never shown or logged."""
    advertise_url: str | None = None
    """The base URL other runtimes on the same PostgreSQL store reach this one at (``http://`` or
    ``https://``, no path), to forward an MCP call about a run this runtime holds
    (docs/runtime-store.md); unset: ``http://<listen>`` (``https://`` with ``tls``). Only read
    with a PostgreSQL ``store``."""
    default_model: str | None = None
    """Model for ``spawn`` without one; by default the first model of the first generative replica."""
    workspace: str | None = None
    """Directory the MCP callers' runs work in (their root filesystem scope, docs/architecture.md "Pods")."""
    max_depth: int = Field(default=3, ge=1)
    """Deepest run tree (a caller's run is level 1) that orchestrating runs may grow."""
    max_children: int = Field(default=8, ge=1)
    """Most live (running or idle) children one run may have."""
    retained_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    """Bytes (tasks, system prompts, conversations, outputs) that finished runs keep in memory
    and in the compacted journal; past it the least recently finished drop their conversation,
    then are forgotten."""
    retained_s: float = Field(default=3600.0, gt=0)
    """Seconds a finished run (and its MCP task) is kept after it ended, within ``retained_bytes``
    and 10,000 runs; past it ``await``/``status`` answer that the handle expired."""
    dataplane_key_env: str | None = None
    """Name of the environment variable holding the caller key the runtime's own turns carry
    to the dataplane (its ``Authorization: Bearer``); unset: ``LUFTPAUSE_TOKEN``. Needed when
    the dataplane has caller keys: their callers are then ``<the key's caller>/<MCP caller>``."""
    tls: TlsListener | None = None
    """TLS (and mutual TLS) on the HTTP listener."""
    limits: ListenerLimits = ListenerLimits()
    """Slow clients and connections at the HTTP listener."""
    dataplane_tls: TlsPeer | None = None
    """TLS options towards an ``https://`` dataplane (its CA, this runtime's client certificate)."""
    turn_retry_seconds: float = Field(default=120.0, ge=0)
    """How long a sub-agent's turn (and ``decide``) is retried when the dataplane answers 429,
    502 or 503 or cannot be reached, from its first try (seconds; 0: never retried); then the run
    fails with the last error (:mod:`luftpause.runtime.dataplane`)."""
    turn_retry_max_wait: float = Field(default=10.0, gt=0)
    """The longest one wait between two tries (seconds): waits grow exponentially, jittered,
    up to it."""
    instructions_dir: str | None = None
    """Folder of named system prompts: ``spawn(instruction="reviewer")`` gives the run the text of
    ``<dir>/reviewer.md``, and ``default.md``, when there is one, is the system prompt of a run
    spawned with neither ``instruction`` nor ``system``. Relative paths are taken from the working
    directory (:mod:`luftpause.runtime.spawn.instructions`)."""

    _check = field_validator("listen")(host_port)

    @field_validator("dataplane")
    @classmethod
    def _dataplane_url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        if value != "file" and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError(f'expected "file" or a postgresql:// URL, got {without_password(value)!r}')
        return value

    @field_serializer("store")
    def _store_shown(self, value: str) -> str:
        return without_password(value)

    def advertised(self) -> str:
        """:attr:`advertise_url` without a trailing ``/``, or ``http(s)://<listen>``."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        return f"{'https' if self.tls is not None else 'http'}://{self.listen}"

    def dataplane_key(self) -> str | None:
        """The caller key read from ``dataplane_key_env`` at call time, or ``None``."""
        return (os.environ.get(self.dataplane_key_env) or None) if self.dataplane_key_env else None


class ReplicaConfig(Section):
    name: str = Field(min_length=1)
    """The replica's name in placements, the scheduler's status and the logs; unique."""
    url: str
    """Base URL of an OpenAI-compatible engine (``http://`` or ``https://``), without ``/v1``."""
    models: tuple[str, ...] = Field(min_length=1)
    """The models it serves (a turn's ``model`` picks among the replicas serving it)."""
    kind: Literal["generative", "single_pass"] = "generative"
    """``"generative"`` (chat turns) or ``"single_pass"`` (classifiers: ``/v1/decide``)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the key sent upstream as ``Authorization: Bearer``."""
    health_path: str = "/health"
    """Path probed for health, from the root of ``url`` (``""``: not checked, counts as healthy)."""
    load_from: tuple[str, ...] = ()
    """For a router: the engines (``http://`` or ``https://`` URLs) whose ``/metrics`` give its load."""
    max_inflight: int = Field(default=32, ge=1)
    """Cap on turns in flight at this replica; the scheduler holds the rest."""
    kv_tokens: int | None = Field(default=None, ge=1)
    """The engine's KV pool in tokens (SGLang's ``max_total_num_tokens`` in ``/server_info``, vLLM's
    ``num_gpu_blocks x block_size`` in its startup log): a run then starts here only while the runs
    in progress here fit it (docs/scheduling.md "KV-token admission"). Unset: slots alone."""
    draining: bool = False
    """Take no new run (the runs already there finish there); the scheduler reads it at start and
    on ``SIGHUP``, as the admin API's ``POST /admin/replicas/{name}/drain`` sets it."""
    priority: EnginePriority | None = None
    """How the engine orders its waiting queue by a request's ``priority`` field, so that the
    dataplane tags each turn with its service class: ``"lower_first"`` (vLLM with
    ``--scheduling-policy priority``; SGLang with ``--enable-priority-scheduling
    --schedule-low-priority-values-first``) or ``"higher_first"`` (SGLang with
    ``--enable-priority-scheduling``), the words of ``luftpause fake-engine --priority``. Unset
    (the default): no ``priority`` is sent. Set it only when the engine was started so: vLLM
    without its priority policy refuses a ``priority`` other than 0 with 400, and SGLang without
    priority scheduling ignores the field or aborts the request. The values sent, and why, are in
    :func:`luftpause.dataplane.turn.with_priority`. Generative replicas only: single-pass turns
    are sent unchanged."""

    apis: tuple[FrontDoorApi, ...] = ("chat",)
    """The front-door APIs the engine serves itself: ``"chat"`` always (every turn the dataplane
    translates becomes Chat Completions), plus ``"messages"`` (vLLM, llama.cpp's server, SGLang
    Model Gateway) and ``"responses"`` (vLLM, SGLang Model Gateway) where it does. A Messages or
    Responses turn placed on a replica that serves its API is relayed unchanged; on another it is
    translated to Chat Completions and its answer back."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)

    @field_validator("apis")
    @classmethod
    def _apis(cls, value: tuple[FrontDoorApi, ...]) -> tuple[FrontDoorApi, ...]:
        if "chat" not in value:
            raise ValueError(
                f"expected 'chat' among them (what every turn is translated to), got {list(value)!r}"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"expected each API once, got {list(value)!r}")
        return value

    # A field validator (``kind`` is validated before it), not a model one, so that the error names
    # ``replicas[N].priority`` as every other key's does.
    @field_validator("priority")
    @classmethod
    def _priority_generative(
        cls, value: EnginePriority | None, info: ValidationInfo
    ) -> EnginePriority | None:
        kind = info.data.get("kind")  # absent when kind itself failed (that error is reported)
        if value is not None and kind is not None and kind != "generative":
            raise ValueError(
                "expected only on a generative replica (single-pass turns are sent "
                f"unchanged), got {value!r} with kind {kind!r}"
            )
        return value

    @field_validator("load_from")
    @classmethod
    def _load_from(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(http_url(url) for url in value)

    @field_validator("health_path")
    @classmethod
    def _health_path(cls, value: str) -> str:
        if value and not value.startswith("/"):
            raise ValueError(f"expected '' or a path starting with '/', got {value!r}")
        return value

    def api_key(self) -> str | None:
        """The upstream key read from ``api_key_env`` at call time, or ``None``."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class McpServerConfig(Section):
    name: str = Field(min_length=1)
    """The server's name in the runtime's status, its errors and the logs; unique."""
    url: str | None = None
    """A streamable HTTP MCP endpoint, e.g. ``http://127.0.0.1:7100/mcp``."""
    command: tuple[str, ...] | None = None
    """A stdio MCP server's argv (instead of ``url``)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables a stdio server's process gets besides the SDK's safe default ones
    (with ``command``)."""
    path_arguments: dict[str, tuple[str, ...] | dict[str, Literal["read", "write"]]] = Field(
        default_factory=dict
    )
    """Per tool, its arguments that are paths: a list (each needs write) or ``{arg = "read" |
    "write"}``; checked against the calling run's scope (:mod:`luftpause.runtime.pods.workspace`)."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError("expected exactly one of 'url' or 'command'")
        return self


class Config(Section):
    scheduler: SchedulerConfig = SchedulerConfig()
    dataplane: DataplaneConfig = DataplaneConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    replicas: tuple[ReplicaConfig, ...] = Field(min_length=1)
    mcp_servers: tuple[McpServerConfig, ...] = ()
    source: str | None = None
    """The file this came from; ``None`` for the embedded default."""

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        for what, names in (
            ("replicas", [r.name for r in self.replicas]),
            ("mcp_servers", [s.name for s in self.mcp_servers]),
        ):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"{what}: expected unique names, {name!r} appears twice")
                seen.add(name)
        return self

    @property
    def is_embedded_default(self) -> bool:
        return self.source is None

    def replica(self, name: str) -> ReplicaConfig:
        """The replica called ``name``; ``KeyError`` if there is none."""
        for replica in self.replicas:
            if replica.name == name:
                return replica
        raise KeyError(name)

    @property
    def models(self) -> list[str]:
        """Every model some replica serves, in configuration order, without repeats."""
        return list(dict.fromkeys(m for r in self.replicas for m in r.models))

    @property
    def default_model(self) -> str:
        if self.runtime.default_model:
            return self.runtime.default_model
        for replica in self.replicas:
            if replica.kind == "generative":
                return replica.models[0]
        return self.replicas[0].models[0]


READ_BY: dict[str, tuple[str, ...]] = {
    "scheduler": ("scheduler", "replicas"),
    "dataplane": ("dataplane", "replicas"),
    "runtime": ("runtime", "scheduler.http", "replicas", "mcp_servers"),
}
"""What each process reads of the configuration: whole tables, arrays of tables, or one key
(``"scheduler.http"``: the runtime lets the scheduler's page read its ``/status``). Its ``--help``
lists these keys (:func:`luftpause.config.settings.help_text`); a new table belongs here too."""


def parse_config(text: str, source: str | None = None, layer: Layer | None = None) -> Config:
    """Parse TOML text into a :class:`Config`, with ``layer`` (environment variables, flags) laid
    over it; raises :class:`ConfigError` naming ``source`` and the key, or the variable or flag."""
    where = source or "embedded default"
    layer = layer or Layer()
    if layer.refused:
        raise ConfigError("; ".join(layer.refused), list(layer.refused))
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    if "source" in data:  # a field of Config, set from where the file was read, never by the file
        raise ConfigError(f"{where}: source: unknown key")
    try:
        merged = arrays_as_tuples(merge(data, layer.values))
        return Config.model_validate({**merged, "source": source})
    except ValidationError as exc:
        raise ConfigError(
            describe_layered(exc, where, layer, Config), fault_lines(exc, where, layer, Config)
        ) from None


def load_config(
    path: str | os.PathLike[str] | None = None, flags: Mapping[KeyPath, tuple[str, str]] | None = None
) -> Config:
    """Load ``path``, else the file named by ``LUFTPAUSE_CONFIG``, else the embedded default, with
    the ``LUFTPAUSE_<TABLE>__<KEY>`` environment variables laid over it and ``flags`` over those
    (``{("dataplane", "listen"): ("--listen", "0.0.0.0:8080")}``; :mod:`luftpause.config.settings`).

    Raises :class:`ConfigError` when the file cannot be read, or it, a variable or a flag has the
    wrong shape.
    """
    layer = from_environment(Config).under(from_flags(Config, flags or {}))
    chosen = path if path is not None else os.environ.get(CONFIG_ENV) or None
    if chosen is None:
        return parse_config(EMBEDDED_DEFAULT, layer=layer)
    file = Path(chosen)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None
    return parse_config(text, str(file), layer)


def split_host_port(address: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` -> ``("127.0.0.1", 8080)``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def listen_url(listen: str) -> str:
    """``http://host:port`` to reach, from this machine, a server listening on ``listen``
    (``host:port``, e.g. ``[runtime] listen``); an all-addresses listen (``0.0.0.0``, ``::``) is
    reached on loopback."""
    host, port = split_host_port(listen)
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
