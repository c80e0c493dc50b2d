"""Run identity from a harness's own session signals (what Claude Code and Codex send on every turn).

Found by running the harnesses against a capture server (``docs/harnesses.md``, "What the harnesses
send"; Claude Code 2.1.197, Codex CLI 0.171.0):

* Claude Code sends ``X-Claude-Code-Session-Id: <uuid>`` on every ``/v1/messages`` request of a
  session, main agent and sub-agents alike; a sub-agent's requests add ``X-Claude-Code-Agent-Id``
  (17 characters, ``a`` + 16 hex) and, below the first level, ``X-Claude-Code-Parent-Agent-Id``.
  The body's ``metadata.user_id`` is a JSON string holding the same ``session_id`` (plus a
  ``device_id``), with no agent id.
* Codex sends ``session-id`` (the root session), ``thread-id`` (this agent's thread: the root's
  equals the session id, a spawned sub-agent has its own), ``x-codex-parent-thread-id`` on a
  sub-agent's requests, and in the body ``prompt_cache_key`` (the root session id, sub-agents
  included) and ``client_metadata`` (the same ids again).

One agent's loop is one run: its turns come one after another and reuse one prefix, while a
sub-agent runs concurrently with its parent on a prefix of its own. So the run is the agent, not
the session: ``claude-code:<session>`` for Claude Code's main agent and
``claude-code:<session>:<agent id>`` for a sub-agent; ``codex:<thread id>`` for Codex (root and
sub-agents alike). A session id alone (Claude Code's body, Codex's ``prompt_cache_key``) would put
a session's sub-agents into the run of their parent, so the body is read only when the headers are
absent (a proxy in between that drops them), and then names the session's run
(``claude-code:<session>``; ``prompt-cache-key:<key>`` for any Responses client).

:func:`harness_session` reads them; ``x-luftpause-run-id`` from the client still wins (the route's
to check first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["HarnessSession", "harness_session"]

_MAX_PART = 100
"""A signal longer than this (characters) is not taken: ids are uuids and short hex strings, and a
run id must stay within the dataplane's 256 bytes."""


@dataclass(frozen=True, slots=True)
class HarnessSession:
    """``run_id``: the run this turn belongs to; ``parent_run_id``: the run that spawned it (a
    sub-agent's parent) or ``None``; ``harness``: ``"claude-code"``, ``"codex"``, or
    ``"responses"`` for any Responses client known only by its ``prompt_cache_key`` (which
    OpenAI defines as a cache-affinity key: what a run's affinity serves); ``source``:
    ``"headers"`` or ``"body"``."""

    run_id: str
    parent_run_id: str | None
    harness: str
    source: str


def _ok(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return value if 0 < len(value) <= _MAX_PART and value.isprintable() else None


def harness_session(
    header: Callable[[str], str | None], payload: Mapping[str, Any] | None = None
) -> HarnessSession | None:
    """The run a harness's request belongs to, from its headers (``header(name)`` returns a header's
    value by lower-case name, or ``None``) or, without them, from its body (parsed JSON); ``None``
    when neither says. Never raises."""
    session = _ok(header("x-claude-code-session-id"))
    if session is not None:
        root = f"claude-code:{session}"
        agent = _ok(header("x-claude-code-agent-id"))
        if agent is None:
            return HarnessSession(root, None, "claude-code", "headers")
        parent = _ok(header("x-claude-code-parent-agent-id"))
        return HarnessSession(
            f"{root}:{agent}", f"{root}:{parent}" if parent else root, "claude-code", "headers"
        )
    thread = _ok(header("thread-id")) or _ok(header("session-id")) or _ok(header("session_id"))
    if thread is not None:
        parent = _ok(header("x-codex-parent-thread-id"))
        return HarnessSession(f"codex:{thread}", f"codex:{parent}" if parent else None, "codex", "headers")
    if payload is None:
        return None
    metadata = payload.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        try:
            user = orjson.loads(metadata["user_id"])
        except orjson.JSONDecodeError:
            user = None
        session = (
            _ok(user.get("session_id"))
            if isinstance(user, dict) and isinstance(user.get("session_id"), str)
            else None
        )
        if session is not None:
            return HarnessSession(f"claude-code:{session}", None, "claude-code", "body")
    key = payload.get("prompt_cache_key")
    if isinstance(key, str) and _ok(key) is not None:
        return HarnessSession(f"prompt-cache-key:{key.strip()}", None, "responses", "body")
    return None
