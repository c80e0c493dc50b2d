"""The configuration's building blocks and its sub-tables: the base of every table
(:class:`Section`: strict, unknown keys refused, attribute docstrings as descriptions), the error a
bad file raises, and the tables nested in a process's table: ``[*.tls]``, ``[*.limits]``,
``[scheduler.protection]`` (limits and the circuit breaker), ``[scheduler.discovery]`` and
``[dataplane.failover]``. :mod:`luftpause.config` builds the whole configuration from them and
re-exports each name.
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from luftpause.scheduler.core.policies.limits import Protection

FrontDoorApi = Literal["chat", "messages", "responses"]
"""A front-door API (``[[replicas]] apis``): OpenAI Chat Completions (``/v1/chat/completions``),
Anthropic Messages (``/v1/messages``), OpenAI Responses (``/v1/responses``)."""


class ConfigError(Exception):
    """The configuration file is unreadable or does not have the expected shape.

    The message names the file, the key and what was expected; the processes print it and exit 2.
    ``problems`` holds the same faults one line each (``luftpause check-config`` prints them so).
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


class Section(BaseModel):
    # strict: a TOML string is never read as a boolean or a number ("no" is not false, "2" not 2);
    # an integer may still stand for a float (``dataplane_grace_s = 2``). TOML arrays arrive as
    # tuples (luftpause.config.faults.arrays_as_tuples), which strict mode asks for. The attribute
    # docstrings are the keys' descriptions (the processes' --help, luftpause.config.settings.help_text).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)


def host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected 'host:port', got {value!r}")
    return value


def http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value.rstrip("/")


SECRET_URL_PARAMETERS = frozenset({"password", "sslpassword"})
"""Query parameters of a database URL that carry a secret (libpq's connection URI takes any
connection keyword as a parameter: PostgreSQL's documentation, "Connection URIs")."""


def without_password(url: str) -> str:
    """``url`` with every password it carries shown as ``***``: the one of its ``user:password@``
    part and the value of a ``password`` or ``sslpassword`` query parameter (for the log, error
    messages and ``check-config``: a database URL carries its credentials). A string that is no
    URL comes back as it is."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or (not parts.netloc and not parts.query):
        return url
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(key in SECRET_URL_PARAMETERS for key, _ in pairs):
            masked = [(key, "***" if key in SECRET_URL_PARAMETERS else value) for key, value in pairs]
            query = urllib.parse.urlencode(masked, safe="*")
    shown = f"{parts.scheme}://{netloc}{parts.path}"  # urlunsplit drops an empty host's "//"
    return shown + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")


class TlsListener(Section):
    """TLS on one listener (opt-in, for deployments across hosts): PEM files, paths relative to the
    working directory. ``[scheduler.tls]`` serves both the scheduler's gRPC port and its HTTP
    status port; ``[dataplane.tls]`` and ``[runtime.tls]`` their HTTP listener
    (:mod:`luftpause.auth.tls`)."""

    cert: str = Field(min_length=1)
    """The server's certificate chain (PEM)."""
    key: str = Field(min_length=1)
    """Its private key (PEM, PKCS#8: ``-----BEGIN PRIVATE KEY-----``, what granian reads)."""
    client_ca: str | None = None
    """CA certificates (PEM): with it, every client must present a certificate one of them
    signed (mutual TLS); without, any client may connect (its token still checked)."""


class TlsPeer(Section):
    """TLS towards a server (``[dataplane.scheduler_tls]``, ``[runtime.dataplane_tls]``): present,
    the link uses TLS."""

    ca: str | None = None
    """CA certificates (PEM) the server's certificate must chain to; unset: the system's roots."""
    cert: str | None = None
    """This client's certificate chain (PEM), for a server that asks for one (mutual TLS)."""
    key: str | None = None
    """Its private key (PEM)."""

    @model_validator(mode="after")
    def _pair(self) -> TlsPeer:
        if (self.cert is None) != (self.key is None):
            raise ValueError("expected both 'cert' and 'key' (mutual TLS) or neither")
        return self


class ListenerLimits(Section):
    """What one HTTP listener gives a client (:mod:`luftpause.serving.listeners`): slow or silent clients
    are cut off, and connections are bounded."""

    header_timeout_s: float = Field(default=10.0, gt=0, le=60)
    """Seconds a client may take to send a request's head (line and headers), and the longest a
    kept-alive connection waits for its next request; then the connection is closed (no answer
    can be sent: the request is not known yet). At most 60 (granian's limit)."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds from a request's head to the end of its body; a body not complete by then is
    answered 408 with the JSON error body and its connection closed."""
    max_connections: int = Field(default=1024, ge=1)
    """Requests served at once; one more is answered 503 with the JSON error body (and
    ``Retry-After: 1``). Connections past this plus a margin wait, unaccepted, in the kernel's
    backlog until one closes."""
    stop_timeout_s: float = Field(default=10.0, ge=0, le=600)
    """Seconds a stop (SIGTERM, Ctrl-C) waits for the requests still open (streams, held turns,
    long MCP calls) before it cuts them off: a stream is then broken, a request not yet answered
    gets 503 with the JSON error body."""


class LimitsConfig(Section):
    """Protection limits of one service class, or a caller's overrides (every key optional: unset
    is no limit, or for a caller the class's own)."""

    max_held: int | None = Field(default=None, ge=0)
    """Most turns of a caller and class held at once; one more that would be held gets 429."""
    queue_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds a turn may be held; past it, it gets 429 (checked every second)."""
    tokens_per_s: float | None = Field(default=None, gt=0)
    """Prompt and completion tokens per second a caller's turns of a class may use (a token bucket
    fed by the usage its finished turns report); a turn arriving while it is empty gets 429."""
    burst_tokens: float | None = Field(default=None, ge=1)
    """The bucket's size in tokens; unset: 10 s of ``tokens_per_s``."""


class ProtectionConfig(Section):
    """``[scheduler.protection]``: opt-in protection limits and the circuit breaker
    (:mod:`luftpause.scheduler.core.policies.limits`); all off by default."""

    breaker_failures: int = Field(default=0, ge=0)
    """Turns failing on one replica (the engine's fault only, not a client leaving) within
    ``breaker_window_s`` and since its last finished turn that open its circuit breaker: it takes
    no turn. ``0``: engine faults never open it (an engine never reached still does, at once)."""
    breaker_window_s: float = Field(default=60.0, gt=0)
    """Seconds a failed turn counts toward ``breaker_failures``; older failures do not."""
    breaker_open_s: float = Field(default=0.0, ge=0)
    """Seconds an open breaker stays open at least; the first healthy probe after that makes it
    half-open. ``0``: the next healthy probe."""
    breaker_success_threshold: int = Field(default=1, ge=1)
    """Trial turns finishing in a row on a half-open replica that close its breaker (a trial
    failing with an engine fault opens it again)."""
    breaker_trial_turns: int = Field(default=1, ge=1)
    """Turns a half-open replica takes at once (its trial turns); other turns go elsewhere or wait."""
    interactive: LimitsConfig = LimitsConfig()
    """Limits of interactive turns, per caller."""
    batch: LimitsConfig = LimitsConfig()
    """Limits of batch turns, per caller."""
    callers: dict[str, LimitsConfig] = Field(default_factory=dict)
    """Per caller (``x-luftpause-caller``; ``""`` the anonymous one): keys that replace the class
    limits for every class of that caller and of every caller under it (``team-a`` holds for
    ``team-a/job-7`` unless a more specific name is configured), counted for it over them all."""

    def policy(self) -> Protection:
        """These settings as the core's :class:`~luftpause.scheduler.core.policies.limits.Protection`."""
        from luftpause.scheduler.core.policies.limits import ClassLimits, Protection

        def limits(table: LimitsConfig) -> ClassLimits:
            return ClassLimits(table.max_held, table.queue_timeout_s, table.tokens_per_s, table.burst_tokens)

        return Protection(
            {"interactive": limits(self.interactive), "batch": limits(self.batch)},
            {caller: limits(table) for caller, table in self.callers.items()},
            self.breaker_failures,
            self.breaker_window_s,
            self.breaker_open_s,
            self.breaker_success_threshold,
            self.breaker_trial_turns,
        )


class DiscoveryConfig(Section):
    """``[scheduler.discovery]``: engine replicas discovered from the Kubernetes API by label
    selector (:mod:`luftpause.scheduler.discovery`), besides the file's ``[[replicas]]``. Every
    ``interval_s`` the scheduler lists the pods of ``namespace`` that match ``label_selector``; each
    running, ready pod with an IP is a replica named after the pod, at ``http://<pod IP>:<port>``,
    serving ``models`` (or the models its ``luftpause.io/models`` annotation names, comma
    separated), with the other keys of a ``[[replicas]]`` table below. A pod gone or not ready is
    removed (its placed turns end where they are)."""

    namespace: str = Field(min_length=1)
    """The namespace whose pods are listed."""
    label_selector: str = Field(min_length=1)
    """A Kubernetes label selector (``app=sglang,tier=gpu``)."""
    port: int = Field(ge=1, le=65535)
    """The engines' HTTP port in each pod."""
    models: tuple[str, ...] = ()
    """The models the discovered engines serve, unless a pod's ``luftpause.io/models`` annotation
    names its own; a pod with neither is skipped (logged once)."""
    kind: Literal["generative", "single_pass"] = "generative"
    """The discovered replicas' kind, as ``[[replicas]] kind``."""
    api_key_env: str | None = None
    """As ``[[replicas]] api_key_env``."""
    health_path: str = "/health"
    """As ``[[replicas]] health_path``."""
    max_inflight: int = Field(default=32, ge=1)
    """As ``[[replicas]] max_inflight``."""
    apis: tuple[FrontDoorApi, ...] = ("chat",)
    """As ``[[replicas]] apis``."""
    interval_s: float = Field(default=10.0, gt=0)
    """Seconds between two listings."""
    api_server: str = "https://kubernetes.default.svc"
    """The Kubernetes API server (in a pod: its Service; a service account's token reads it)."""
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    """The bearer token sent to the API server (re-read at every listing: tokens rotate)."""
    ca_file: str | None = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    """CA certificates (PEM) the API server's certificate must chain to; unset: the system's roots."""

    @field_validator("api_server")
    @classmethod
    def _api_server(cls, value: str) -> str:
        return http_url(value)


class FailoverConfig(Section):
    """``[dataplane.failover]``: what a turn whose replica failed before its answer began may do
    (docs/failover.md; after SGLang Model Gateway's ``--retry-*`` options, which retry 408, 429,
    500, 502, 503 and 504)."""

    undelivered: bool = True
    """A turn whose engine could not be connected to, or closed or reset the connection before
    any byte of its answer, is admitted once more (the scheduler places it on another healthy
    replica of its model) and the replica is marked unhealthy at once."""
    retry_statuses: tuple[int, ...] = ()
    """Engine statuses (5xx) that send the turn once more to another replica instead of relaying
    the refusal, e.g. ``[502, 503, 504]``. Empty (the default): none, as an engine that answered
    may have worked on the turn."""

    @field_validator("retry_statuses")
    @classmethod
    def _statuses(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 500 <= status <= 599 for status in value):
            raise ValueError(f"expected 5xx statuses, got {list(value)!r}")
        return value
