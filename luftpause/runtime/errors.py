"""Every error of the runtime, each with the HTTP status it maps to (``status``) and how MCP
clients see it.

How they reach people: an MCP tool reports a :class:`RuntimeFault` as a tool error (``isError:
true``, the message as its text: :mod:`luftpause.runtime.mcp`); the monitor's routes answer it
with ``status`` and the JSON error body ``{"error": {"message"}}`` (:mod:`luftpause.runtime.web`);
inside a sub-agent's loop a fault of a turn ends the run ``failed`` with the message as its
``error``, and a fault of a tool call goes back to the model as the call's result (``Error: ...``,
a failed tool call). The tree::

    RuntimeFault (500)                    a fault of ours; tool error "internal error ..."
    ├── BadToolInput (400)                an argument the schema cannot express
    │   ├── SpawnRefused (400)            spawn's arguments refused: a parent unknown, cancelled or
    │   │                                 stopped, unknown tool names, an instruction not found,
    │   │                                 a child asking more than its spawner has
    │   ├── PodRefused (400)              a pod operation refused: depth or children limit, a name
    │   │                                 taken, a run out of reach, a full inbox, a stopped run
    │   ├── BadScope (400)                a scope rule that is not a rule (relative path, ...)
    │   ├── ScopeExceeded (400)           "scope exceeds the spawner's: write /etc"
    │   └── WorkspaceError (400)          a built-in file tool refused: missing file, ``old`` not
    │                                     unique, too large, not a regular file
    ├── ScopeDenied (403)                 "write /ws/x denied by rule deny write /ws (held by ...)"
    ├── UnknownRun (404)                  no run has this handle: "unknown run handle 'run-…'"
    ├── UnknownModel (404)                no generative replica serves the model named
    ├── NoPendingApproval (409)           ``approve`` on a run (or call id) that waits for none
    ├── ExpiredRun (410)                  the run finished and was dropped after its retention
    ├── DataplaneFailed (502)             a request to the dataplane failed (its status and message,
    │   │                                 or no connection, or no answer in time)
    │   ├── TurnFailed (502)              an LLM turn of a run: the run ends ``failed``
    │   └── DecideFailed (502)            a ``decide`` classification
    └── UpstreamUnavailable (502)         an upstream MCP tool server cannot be reached or listed

    JournalWriteError (OSError)           a journal record could not be written: a spawn or task
                                          refused ("could not be journaled"), a run marked not
                                          durable (``durable: false``)
    └── LeaseLost                         refused by fencing: another runtime holds the run now
                                          (its lease moved); the loop stops driving it
    StoreUnusable (OSError)               the PostgreSQL store cannot be used at start: unreachable,
                                          its schema newer than this luftpause, psycopg missing
    ToolArgumentsError (ValueError)       a model's tool call whose arguments do not fit the tool's
                                          schema: the call's result is "Error: invalid arguments
                                          for <tool>: <what and the shape expected>" (defined in
                                          :mod:`luftpause.runtime.agent.tool_arguments`, which
                                          raises nothing else)
    web.monitor.Refused (4xx)             a monitor request refused before it acts: 421 a Host not
                                          served, 415 not JSON, 403 not the page's Origin, 413 a
                                          body too large

Not exceptions of ours, for completeness: JSON-RPC errors the Tasks extension answers with
(``-32602`` an unknown task id, ``-32021`` the extension not declared; :mod:`luftpause.runtime.mcp.tasks`);
401 for a missing or wrong bearer token, 404 for an unknown path, 405 with ``Allow``, 421 for a
``Host`` not served on ``/status``, 500 for a fault of ours (:mod:`luftpause.runtime.web`): the
HTTP edge answers those before any part of the runtime runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from luftpause.runtime.pods.scope import Decision, Excess


class RuntimeFault(Exception):
    """Base: ``status`` is the HTTP status, ``str(err)`` the message shown to the client."""

    status = 500


class BadToolInput(RuntimeFault):
    """An argument the tool's schema cannot express, or that the runtime refuses as it stands."""

    status = 400


class SpawnRefused(BadToolInput):
    """``spawn`` (or ``run``, or a sub-agent's own ``spawn``) refused before anything was recorded;
    the message says which argument and why."""


class PodRefused(BadToolInput):
    """A pod operation that cannot be done: a limit, a name taken, a run out of reach."""


class BadScope(BadToolInput):
    """A rule or scope that cannot be read: the message says which part and why."""


class ScopeExceeded(BadToolInput):
    """A grant asks for more than the parent's effective scope; ``excess`` lists what."""

    def __init__(self, excess: Excess) -> None:
        super().__init__(f"scope exceeds the spawner's: {excess}")
        self.excess = excess


class WorkspaceError(BadToolInput):
    """A built-in workspace tool could not do what was asked (the message says what and where)."""


class ScopeDenied(RuntimeFault):
    """An access the scope does not allow; ``decision`` says which rule denied it. ``asked`` is the
    path as the caller wrote it, named in the message when it resolved elsewhere (``..``, a
    symlink): ``write /etc/x denied: no rule of the scope allows it (asked for /ws/link/x)``."""

    status = 403

    def __init__(self, decision: Decision, asked: str | None = None) -> None:
        message = str(decision)
        if asked is not None and asked != decision.path:
            message += f" (asked for {asked})"
        super().__init__(message)
        self.decision = decision
        self.asked = asked


class UnknownRun(RuntimeFault):
    """No run has ``handle``; the message names it."""

    status = 404

    def __init__(self, handle: str) -> None:
        super().__init__(f"unknown run handle {handle!r}")
        self.handle = handle


class UnknownModel(RuntimeFault):
    """A model that no generative replica serves; the message names it and the models that are
    served."""

    status = 404

    def __init__(self, model: str, served: list[str]) -> None:
        listed = ", ".join(map(repr, served)) or "none"
        super().__init__(f"no generative replica serves model {model!r}; models served: {listed}")
        self.model = model


class NoPendingApproval(RuntimeFault):
    """``approve`` on a run that waits for no approval (or for none with that id); the message says
    which run and what it does wait for."""

    status = 409


class ExpiredRun(RuntimeFault):
    """The run with ``handle`` finished and was evicted from the registry (its retention time
    passed, or the cap on finished runs or on their bytes was reached); its result is gone."""

    status = 410

    def __init__(
        self, handle: str, retention_seconds: float, max_finished: int, retained_bytes: int | None = None
    ) -> None:
        within = f", within {retained_bytes} bytes ([runtime] retained_bytes)" if retained_bytes else ""
        super().__init__(
            f"run handle {handle!r} expired: finished runs are kept {retention_seconds:g} s after "
            f"they end (at most {max_finished} of them{within}), and this one is gone"
        )
        self.handle = handle


class DataplaneFailed(RuntimeFault):
    """A request to the dataplane failed: a non-429 HTTP error status (the message carries the
    dataplane's own message), no connection at all, or no answer within the time allowed."""

    status = 502


class TurnFailed(DataplaneFailed):
    """An LLM turn of a run failed (the run ends ``failed`` with this message)."""


class DecideFailed(DataplaneFailed):
    """A ``decide`` classification could not be made; the message says why."""


class UpstreamUnavailable(RuntimeFault):
    """An upstream MCP server (named in the message) could not be connected to or listed."""

    status = 502


class JournalWriteError(OSError):
    """A record could not be written to the journal; the message names the file and the OS error."""


class LeaseLost(JournalWriteError):
    """A record refused by fencing: the run's lease moved to another runtime, which drives it now
    (:mod:`luftpause.runtime.runs.custody`)."""


class StoreUnusable(OSError):
    """The runs' store cannot be used: the message says where (the URL without its password) and
    why (unreachable after retries, a schema newer than this luftpause knows)."""


def http_status(error: BaseException, default: int = 400) -> int:
    """The HTTP status an error maps to: a :class:`RuntimeFault`'s ``status``; ``default`` for
    anything else that reached an answer."""
    status: Any = getattr(error, "status", None)
    return status if isinstance(status, int) and isinstance(error, RuntimeFault) else default
