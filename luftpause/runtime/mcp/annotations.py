"""The MCP tool annotations and titles of the runtime's tools, in one table.

MCP's hints (spec 2025-06-18 and later, ``ToolAnnotations``; clients treat them as untrusted):
``readOnlyHint`` (the tool does not modify its environment; default false), ``destructiveHint``
(it may destroy or irreversibly change something; default true, meaningful when not read-only),
``idempotentHint`` (calling it again with the same arguments has no further effect; meaningful when
not read-only), ``openWorldHint`` (it reaches entities outside the runtime; default true). Every
hint is given explicitly, so no client falls back on a default: Codex, for one, refuses any tool
not marked read-only unless configured otherwise (``approval_mode``).

Why each is what it is:

* ``spawn``, ``run``: they start a sub-agent that calls upstream MCP tool servers (open world);
  nothing is destroyed; each call starts another run (not idempotent).
* ``send``: continues a run, which may call upstream tools again (open world); each message is
  another turn (not idempotent).
* ``await``, ``status``, ``read``, ``list``, ``tools``, ``decide``: read-only (``await`` and
  ``status`` hand over the caller's pending notifications once, ``read`` moves a pointer counter:
  bookkeeping, not the environment; ``decide`` asks the engine pool one scoring turn).
* ``cancel``, ``stop``: they end runs and what they would have done (destructive), and ending a
  run twice does nothing more (idempotent); they reach no one outside.
* ``approve``: it lets a tool call go that its server marked destructive (or a spawner asked
  approval for), so it is marked destructive and open world itself; answering the same call twice
  is refused the second time (idempotent).
"""

from __future__ import annotations

from mcp_types import ToolAnnotations


def _hints(
    title: str, *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool
) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


ANNOTATIONS: dict[str, ToolAnnotations] = {
    "spawn": _hints(
        "Spawn a sub-agent", read_only=False, destructive=False, idempotent=False, open_world=True
    ),
    "run": _hints(
        "Run a sub-agent and wait", read_only=False, destructive=False, idempotent=False, open_world=True
    ),
    "await": _hints("Await runs", read_only=True, destructive=False, idempotent=True, open_world=False),
    "status": _hints("Run status", read_only=True, destructive=False, idempotent=True, open_world=False),
    "cancel": _hints("Cancel a run", read_only=False, destructive=True, idempotent=True, open_world=False),
    "send": _hints(
        "Send a run a message", read_only=False, destructive=False, idempotent=False, open_world=True
    ),
    "read": _hints(
        "Read a run's output", read_only=True, destructive=False, idempotent=True, open_world=False
    ),
    "stop": _hints(
        "Stop a run gracefully", read_only=False, destructive=True, idempotent=True, open_world=False
    ),
    "list": _hints("List runs", read_only=True, destructive=False, idempotent=True, open_world=False),
    "approve": _hints(
        "Answer a tool-call approval", read_only=False, destructive=True, idempotent=True, open_world=True
    ),
    "decide": _hints(
        "Classify an input", read_only=True, destructive=False, idempotent=True, open_world=False
    ),
    "tools": _hints("Sub-agent tools", read_only=True, destructive=False, idempotent=True, open_world=False),
}
"""Each runtime tool's annotations, its ``title`` among them (also the tool's own ``title``)."""


def title(tool: str) -> str:
    """The human-readable title of ``tool``."""
    value = ANNOTATIONS[tool].title
    assert value is not None
    return value
