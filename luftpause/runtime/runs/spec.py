"""What a run is asked: spawn's arguments, declared once, and every surface derived from them.

:class:`SpawnArguments` is the one declaration of ``spawn``'s contract (field names in Python,
their camelCase wire names as aliases, bounds, defaults and descriptions). From it come:

* the MCP tools ``spawn`` and ``run`` (their signatures, hence their input schemas, are generated
  from its fields: :mod:`luftpause.runtime.mcp.signatures`);
* the input schema of a sub-agent's own built-in ``spawn`` (:func:`spawn_schema`, without
  ``parent``: the spawner is the parent);
* the journal's ``start`` record and its replay (:class:`RunSpec`, the arguments as the spawner
  resolved them, with the caller).

Wire shape (camelCase; ``?`` marks an optional argument, defaults after ``=``)::

    {"task", "model"?, "serviceClass" = "interactive" | "batch", "system"?, "instruction"?,
     "maxToolCalls" = 8 (0..1000), "tools"?: [name], "maxTokens" = 256 (0..1,000,000; 0 = the
     engine's default), "parallelToolCalls" = false, "parent"?: handle, "budgetTokens"? (1..1e12),
     "budgetToolCalls"? (1..1e9), "budgetSeconds"? (0 < s <= one year), "approveTools"?: [name],
     "name"? (1-64 characters), "scope"?: [rule], "orchestrate" = false}

``task`` and ``system`` hold at most :data:`MAX_TEXT_BYTES` of UTF-8 each. A value outside its bound
is refused by validation (a ``pydantic.ValidationError``, whose text names the field), as is a key
the model does not declare (``extra="forbid"``).

Pure: no IO; imports pydantic only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

ServiceClass = Literal["interactive", "batch"]

DEFAULT_MAX_TOOL_CALLS = 8
"""Tool calls a run may make unless ``maxToolCalls`` says otherwise (DESIGN constants)."""

DEFAULT_MAX_TOKENS = 256
"""Reply length per turn, tokens, unless ``maxTokens`` says otherwise (0: the engine's default)."""

MAX_TOOL_CALLS = 1000
"""Highest ``maxToolCalls``: 125 times the default budget of 8, far past any sub-agent task, and
low enough that every counter stays a small integer (an unbounded one reached ``GET /status`` as a
number JSON encoders refuse)."""

MAX_TOKENS_PER_TURN = 1_000_000
"""Highest ``maxTokens`` per turn: above the longest context any engine serves today, so it never
refuses a real request, and a bound on what we send on."""

MAX_BUDGET_TOKENS = 10**12
"""Highest ``budgetTokens``: far past any run, and a bound that keeps counters small integers."""

MAX_BUDGET_TOOL_CALLS = 10**9
"""Highest ``budgetToolCalls``."""

MAX_BUDGET_SECONDS = 365 * 24 * 3600.0
"""Highest ``budgetSeconds`` (a year): past it a timer is pointless."""

MAX_TEXT_BYTES = 1024 * 1024
"""Longest ``task`` and ``system``, each, in UTF-8 bytes (1 MiB, about 260,000 tokens): past the
context of any engine served today, so no real task is refused, while every run a client spawns
holds at most this much of its own text until it is dropped. (The SDK refuses a whole request body
past 4 MiB with HTTP 413 before any tool sees it.)"""

MAX_NAME_CHARS = 64
"""Longest pod name (``name``)."""


def text_size_problem(name: str, text: str | None, limit: int = MAX_TEXT_BYTES) -> str | None:
    """Why ``text`` is refused as argument ``name``: longer than ``limit`` UTF-8 bytes (a lone
    surrogate counts 3, as it would be written); ``None`` when it fits."""
    if text is None or len(text) * 4 <= limit:  # at most 4 bytes a character: no need to encode
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size <= limit:
        return None
    return (
        f"{name} is {size:,} bytes (UTF-8); spawn accepts at most {limit:,} bytes "
        f"({limit / 1024 / 1024:g} MiB) of it"
    )


def _at_most_1_mib(name: str) -> Callable[[str | None], str | None]:
    def check(text: str | None) -> str | None:
        problem = text_size_problem(name, text)
        if problem is not None:
            raise ValueError(problem)
        return text

    return check


RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "effect": {"type": "string", "enum": ["allow", "deny"]},
        "access": {
            "type": "array",
            "items": {"type": "string", "enum": ["read", "write"]},
            "minItems": 1,
            "uniqueItems": True,
        },
        "path": {"type": "string", "description": "absolute path; covers it and everything under it"},
    },
    "required": ["effect", "access", "path"],
    "additionalProperties": False,
}
"""JSON Schema of one scope rule as a tool argument and in journal records; what a rule *means* is
:mod:`luftpause.runtime.pods.scope`."""

SCOPE_DESCRIPTION = (
    "Filesystem scope: allow/deny rules on path prefixes; the most specific rule wins, "
    "deny wins a tie, nothing matching is denied. Must be within the spawner's scope."
)

SCOPE_SCHEMA: dict[str, Any] = {"type": "array", "items": RULE_SCHEMA, "description": SCOPE_DESCRIPTION}
"""JSON Schema of a scope: a list of rules (:data:`RULE_SCHEMA`)."""

_WIRE = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)


class SpawnArguments(BaseModel):
    """``spawn``'s arguments (and ``run``'s, but its ``timeout``): see the module docstring.

    Python names are snake_case, the wire's camelCase names are the aliases; both are accepted.
    Frozen: a spawner derives a resolved copy (:meth:`pydantic.BaseModel.model_copy`) instead of
    changing what it was given."""

    model_config = _WIRE

    task: Annotated[
        str,
        Field(min_length=1, description="what the sub-agent should do"),
        AfterValidator(_at_most_1_mib("task")),
    ]
    model: Annotated[str | None, Field(description="model name; default: the runtime's")] = None
    service_class: Annotated[ServiceClass, Field(alias="serviceClass")] = "interactive"
    system: Annotated[
        str | None,
        Field(description="system prompt, inline (or name one with instruction)"),
        AfterValidator(_at_most_1_mib("system")),
    ] = None
    instruction: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="a named system prompt from the runtime's instructions folder",
        ),
    ] = None
    max_tool_calls: Annotated[
        int, Field(alias="maxToolCalls", ge=0, le=MAX_TOOL_CALLS, description="tool budget of the run")
    ] = DEFAULT_MAX_TOOL_CALLS
    tools: Annotated[list[str] | None, Field(description="tool names it may use")] = None
    max_tokens: Annotated[
        int,
        Field(alias="maxTokens", ge=0, le=MAX_TOKENS_PER_TURN, description="reply length per turn, tokens"),
    ] = DEFAULT_MAX_TOKENS
    parent: Annotated[str | None, Field(description="handle of the parent run")] = None
    parallel_tool_calls: Annotated[
        bool, Field(alias="parallelToolCalls", description="several tool calls per reply, run concurrently")
    ] = False
    budget_tokens: Annotated[
        int | None,
        Field(alias="budgetTokens", ge=1, le=MAX_BUDGET_TOKENS, description="tokens for the whole subtree"),
    ] = None
    budget_tool_calls: Annotated[
        int | None,
        Field(
            alias="budgetToolCalls",
            ge=1,
            le=MAX_BUDGET_TOOL_CALLS,
            description="tool calls for the whole subtree",
        ),
    ] = None
    budget_seconds: Annotated[
        float | None,
        Field(
            alias="budgetSeconds",
            gt=0,
            le=MAX_BUDGET_SECONDS,
            # NaN would compare false with every bound and never run out: refused instead.
            allow_inf_nan=False,
            description="seconds for the whole subtree",
        ),
    ] = None
    approve_tools: Annotated[
        list[str] | None,
        Field(alias="approveTools", description="tool names whose every call waits for your approval"),
    ] = None
    name: Annotated[
        str | None,
        Field(min_length=1, max_length=MAX_NAME_CHARS, description="a name unique among your live runs"),
    ] = None
    scope: Annotated[
        list[dict[str, Any]] | None,
        Field(description=SCOPE_DESCRIPTION, json_schema_extra={"items": RULE_SCHEMA}),
    ] = None
    orchestrate: Annotated[
        bool, Field(description="offer it spawn/send/read/stop/list on its own children")
    ] = False

    @property
    def allowed_tools(self) -> frozenset[str] | None:
        """``tools`` as a set (``None``: every tool)."""
        return frozenset(self.tools) if self.tools is not None else None

    @property
    def approval_tools(self) -> frozenset[str]:
        """``approveTools`` as a set."""
        return frozenset(self.approve_tools or ())

    @property
    def limits(self) -> dict[str, float]:
        """The budgets set for the subtree, by ``BUDGET_KEYS`` name (only those set)."""
        values = {
            "tokens": self.budget_tokens,
            "toolCalls": self.budget_tool_calls,
            "seconds": self.budget_seconds,
        }
        return {k: v for k, v in values.items() if v is not None}


class RunSpec(SpawnArguments):
    """A run's spawn arguments as its spawner resolved them, and who asked: ``model`` chosen,
    ``system`` the named instruction's text when one was named, ``tools`` and ``approveTools`` as
    inherited down the tree, ``parent`` the spawning run for a sub-agent's child, ``scope`` left
    out (the scope ledger holds it: :mod:`luftpause.runtime.pods.scopes`).

    It is the journal's ``start`` record (:meth:`start_record`) and is rebuilt from one
    (:meth:`from_record`)."""

    model: str  # resolved: always set here
    caller: str = "anonymous"
    tenant: str | None = None
    """The root caller of the key that spawned it, with caller keys configured (a sub-agent's
    child inherits it): whose run it is (:mod:`luftpause.runtime.runs.tenants`)."""
    scope: None = None  # held by the ledger, never in the record

    def start_record(self, handle: str, at: float) -> dict[str, Any]:
        """``{"type": "start", "handle", "at", <every field but scope, camelCase>}``: the journal
        record of the run's spawn (shape: :mod:`luftpause.runtime.runs.journal`)."""
        fields = self.model_dump(mode="json", by_alias=True, exclude={"scope"})
        return {"type": "start", "handle": handle, "at": at, **fields}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunSpec:
        """The spec a ``start`` (or compacted ``run``) record holds. A record of an older runtime
        lacks the newer fields (they take their defaults); keys that are not spawn arguments
        (``type``, ``handle``, ``at``, a compacted record's outcome) are ignored. Raises
        ``pydantic.ValidationError`` (a ``ValueError``) for a record that does not fit."""
        known = {name for field_name, f in cls.model_fields.items() for name in (field_name, f.alias) if name}
        fields = {k: v for k, v in record.items() if k in known and k != "scope"}
        if fields.get("caller") in (None, ""):
            fields["caller"] = "anonymous"
        if fields.get("serviceClass") not in ("interactive", "batch"):
            fields["serviceClass"] = "interactive"  # as every turn without a class is treated
        return cls.model_validate(fields)


def spawn_schema(exclude: frozenset[str] = frozenset({"parent"})) -> dict[str, Any]:
    """The JSON Schema (2020-12, wire names) of :class:`SpawnArguments` without the fields
    ``exclude`` names (Python or wire names), closed to other keys: the input schema of a
    sub-agent's built-in ``spawn`` (whose parent is always the spawner)."""
    schema = SpawnArguments.model_json_schema(by_alias=True)
    dropped = {f.alias or name for name, f in SpawnArguments.model_fields.items() if name in exclude}
    dropped |= exclude
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k not in dropped}
    schema["required"] = [k for k in schema.get("required", ()) if k not in dropped]
    schema["additionalProperties"] = False
    schema.pop("title", None)
    return schema
