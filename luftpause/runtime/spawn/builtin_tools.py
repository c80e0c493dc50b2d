"""The runtime's own tools a sub-agent is offered beside the upstream ones.

* ``read_file``, ``write_file``, ``edit_file``, ``list_directory`` (:mod:`luftpause.runtime.pods.workspace`)
  to a run that holds a filesystem scope, checked against its effective scope on the real path;
* ``spawn``, ``send``, ``read``, ``stop``, ``list`` to a run spawned with ``orchestrate: true``,
  acting on its own descendants only: ``spawn`` through the one spawner
  (:mod:`luftpause.runtime.spawn.spawner`; its input schema is spawn's contract without ``parent``,
  :func:`luftpause.runtime.runs.spec.spawn_schema`), the others through the pod operations
  (:mod:`luftpause.runtime.pods.operations`).

Built-in tools do not go through the approval gate although ``write_file`` / ``edit_file`` carry
``destructiveHint``: the scope is their gate (a person granted the paths when they set the
workspace and scopes). A call's result is JSON text for the orchestration tools; a refusal is
``Error: <why>`` (a failed tool call), never an exception.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Tool
from pydantic import ValidationError

from luftpause.runtime.errors import PodRefused, RuntimeFault
from luftpause.runtime.pods.actors import Actor
from luftpause.runtime.pods.operations import PodOperations
from luftpause.runtime.pods.scopes import RunScopes
from luftpause.runtime.pods.workspace import TOOL_SCHEMAS, TOOLS
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.spec import SpawnArguments, spawn_schema
from luftpause.runtime.spawn.spawner import Spawner

log = logging.getLogger("luftpause.runtime.builtins")


def _tool(schema: Mapping[str, Any]) -> Tool:
    return Tool.model_validate(schema)


WORKSPACE_TOOLS = tuple(_tool(s) for s in TOOL_SCHEMAS)
_HANDLE = {"type": "string", "description": "a run's handle, or the name you gave your child"}
ORCHESTRATION_SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "name": "spawn",
        "description": (
            "Start a child sub-agent on `task`; returns its handle at once. `name` (unique among your "
            "children) lets you address it. `scope` hands it part of your filesystem scope (allow/deny "
            "rules); what you give for writing you cannot write until it answers or stops. "
            "`orchestrate` lets it spawn children of its own. It gets your tools, or the part of "
            "them you name in `tools`; tools needing approval for you need it for it too, and "
            "`approveTools` adds more. It runs on your model, reply length (`maxTokens`) and service "
            "class unless you give others: any model of the pool, no longer replies than yours, "
            "batch if you are batch. `budgetTokens`, `budgetToolCalls` and `budgetSeconds` bound it "
            "and its children, within your own budgets. `instruction` names a system prompt of the "
            "runtime's instructions folder; `system` gives one inline. You are told when it answers, "
            "fails or stops."
        ),
        "inputSchema": spawn_schema(),
    },
    {
        "name": "send",
        "description": (
            "Send a message to your child run: an idle one continues with it, a busy one gets it "
            "at its next turn."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE, "message": {"type": "string", "minLength": 1}},
            "required": ["handle", "message"],
            "additionalProperties": False,
        },
    },
    {
        "name": "read",
        "description": (
            "Your child run's output entries after cursor `since` (all without it), a new cursor "
            "and its state (running, idle, stopped)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE, "since": {"type": "integer", "minimum": 0}},
            "required": ["handle"],
            "additionalProperties": False,
        },
    },
    {
        "name": "stop",
        "description": (
            "Stop your child run gracefully: its current turn finishes, no new one starts, its "
            "scope returns to you (the answer says what returns and what stays with its children)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE},
            "required": ["handle"],
            "additionalProperties": False,
        },
    },
    {
        "name": "list",
        "description": (
            "Your child runs (or those of your descendant `handle`): name, state, scope held, last answer."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE},
            "additionalProperties": False,
        },
    },
)


def _naming_models(tool: Mapping[str, Any], spawner: Spawner) -> dict[str, Any]:
    """``tool`` (the built-in ``spawn``) with its ``model`` as ``spawner`` takes it: an enum of the
    models served (:meth:`~luftpause.runtime.spawn.spawner.Spawner.model_schema`)."""
    schema = tool["inputSchema"]
    model = {**schema["properties"]["model"], **spawner.model_schema()}
    return {**tool, "inputSchema": {**schema, "properties": {**schema["properties"], "model": model}}}


class BuiltinTools:
    """The built-in tools of the module docstring, for the loop
    (:class:`~luftpause.runtime.agent.loop.BuiltinTools`)."""

    def __init__(self, scopes: RunScopes, pods: PodOperations, spawner: Spawner) -> None:
        self.scopes = scopes
        self.pods = pods
        self.spawner = spawner
        self.orchestration = tuple(
            _tool(_naming_models(t, spawner) if t["name"] == "spawn" else t) for t in ORCHESTRATION_SCHEMAS
        )
        """The orchestration tools, ``spawn``'s ``model`` an enum of the models ``spawner`` takes."""

    def offered(self, run: Run) -> list[Tool]:
        tools: list[Tool] = []
        if self.scopes.holds(run):
            tools.extend(WORKSPACE_TOOLS)
        if run.spec.orchestrate:
            tools.extend(self.orchestration)
        return tools

    async def call(self, run: Run, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """One built-in tool call: ``(text, failed)``; never raises but for cancellation. A
        workspace tool runs in a worker thread against a snapshot of the run's effective scope
        taken here, on the event loop (the ledger is not thread-safe and may change meanwhile:
        the snapshot is the scope as it stood when the call began)."""
        try:
            if name in TOOLS:
                effective = self.scopes.effective(run)
                if effective is None:
                    return f"Error: {name}: this run holds no filesystem scope now", True
                text = await asyncio.to_thread(
                    TOOLS[name], effective.check, arguments, base=self.scopes.workspace
                )
                return text, False
            return json.dumps(self._orchestrate(run, name, arguments), ensure_ascii=False), False
        except (RuntimeFault, ToolError) as exc:
            return f"Error: {exc}", True
        except ValidationError as exc:
            return f"Error: invalid arguments for {name}: {_first_error(exc)}", True
        except Exception as exc:  # an OSError, a UnicodeError, a KeyError: the tool failed, not the run
            log.info("%s: built-in tool %s raised %r", run.handle, name, exc)
            return f"Error: {name} failed: {type(exc).__name__}: {exc}", True

    def _orchestrate(self, run: Run, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        actor = Actor.of_run(run)
        if name == "spawn":
            child = self.spawner.spawn(SpawnArguments.model_validate(arguments), actor)
            return {"handle": child.handle, "name": child.name, "state": child.pod_state}
        if name == "send":
            return self.pods.send(actor, arguments["handle"], arguments["message"])
        if name == "read":
            return self.pods.read(actor, arguments["handle"], arguments.get("since"))
        if name == "stop":
            return self.pods.stop(actor, arguments["handle"])
        if name == "list":
            return self.pods.list_runs(actor, of=arguments.get("handle"))
        raise PodRefused(f"no built-in tool {name!r}")


def _first_error(exc: ValidationError) -> str:
    """A validation error in a line: the first problem and where (the model corrects one at a time)."""
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "arguments"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg')}{more}"
