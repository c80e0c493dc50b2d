"""Which run a turn belongs to (docs/architecture.md "The proxy", "Front-door APIs").

In this order: the client's ``x-luftpause-run-id``; on the Messages and Responses routes, the
harness's own session headers (``apis.sessions``: Claude Code's ``X-Claude-Code-Session-Id`` and
``-Agent-Id``, Codex's ``thread-id``); the run that emitted one of the tool-call ids the request
echoes, remembered on this dataplane (``tool_calls``); on those routes again, the session the body
names (Claude Code's ``metadata.user_id``, a Responses ``prompt_cache_key``); else a new run, made
up here. A run that ended (``DELETE /v1/runs/{id}``) is not found by its tool-call ids any more,
until its client names it again.

A made-up run for a request that echoes tool-call ids this dataplane does not know is provisional:
the run that emitted them may have had its turns on another worker of this host or another
dataplane. The ids go to the scheduler with the turn's admission (``AdmitRequest.tool_call_ids``),
which knows every dataplane's, and the turn takes the run the scheduler names
(``AdmitReply.run_id``); such a turn never goes under a capacity lease, which would place it
before the scheduler could say.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from luftpause.dataplane.apis.sessions import harness_session
from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.intake.checks import RUN_ID_MAX_BYTES, acceptable_run_id
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.turn import RUN_ID_HEADER, new_id
from luftpause.tool_calls import MAX_LOOKUP_IDS, ToolCallTable

__all__ = ["RunIdentity"]


class RunIdentity:
    """``RunIdentity(runs, tool_calls, ended_runs)``: the dataplane's run table (a made-up run is
    recorded there, so its first turn may use a lease), its ``tool_call_id -> run`` table, and its
    ended runs (run id -> when it ended; shared with the ``DELETE`` route and the pruning)."""

    def __init__(self, runs: RunTable, tool_calls: ToolCallTable, ended_runs: dict[str, float]) -> None:
        self.runs = runs
        self.tool_calls = tool_calls
        self.ended_runs = ended_runs

    def run_of(
        self,
        header: Callable[[str], str | None],
        service_class: int,
        caller: str,
        now: float,
        echoed: Callable[[], list[str]],
        payload: Mapping[str, Any] | None = None,
    ) -> tuple[str, bool, tuple[str, ...]]:
        """The run a turn belongs to, whether it was made up for it, and the tool-call ids to ask
        the scheduler about (those the request answers, when the run was made up although it
        answers some: see the module docstring; else empty).

        ``header(name)`` reads a request header by lower-case name (``None``: absent); ``now`` is
        the loop's time (seconds); ``echoed()`` gives the tool-call ids the request answers (read
        only when no header names the run); ``payload`` is the parsed body of a Messages or
        Responses request (``None`` on the chat route: no harness signals there). Raises
        :class:`BadRequest` for a run id over ``RUN_ID_MAX_BYTES``."""
        run_id = header(RUN_ID_HEADER)
        if run_id and not acceptable_run_id(run_id):
            raise BadRequest(f"{RUN_ID_HEADER} is longer than {RUN_ID_MAX_BYTES} bytes")
        if not run_id and payload is not None:
            session = harness_session(header)
            run_id = session.run_id if session is not None else None
        if run_id:
            if self.ended_runs and run_id in self.ended_runs:
                del self.ended_runs[run_id]  # named again by its client: its tool-call ids count again
            return run_id, False, ()
        # No name: the run that emitted a tool call answered here, else the body's session, else new.
        ids = echoed()
        found = self.tool_calls.lookup(ids, now)
        if found and found not in self.ended_runs:  # a run that ended (DELETE) takes no more turns
            return found, False, ()
        if payload is not None:
            session = harness_session(header, payload)
            if session is not None:
                self.ended_runs.pop(session.run_id, None)
                return session.run_id, False, ()
        run_id = f"run-{new_id()}"
        self.runs.new_run(run_id, service_class, caller, now)  # so it may use a lease
        # Ids found here only for a run that ended are not asked about: that run takes no more turns.
        return run_id, True, () if found else tuple(ids[:MAX_LOOKUP_IDS])
