"""The ``tool_call_id -> run`` table, shared by the dataplane (each worker's own table: which run
emitted the tool calls a request answers) and the scheduler's shell (every dataplane's, for turns a
worker did not know; docs/architecture.md "Several workers and several dataplanes"); so it sits
beside both processes rather than inside either.

This module picks the compiled twin if it was built, else the pure-Python one.

``LUFTPAUSE_NO_EXTENSIONS`` (any value but empty or ``0``) forces the pure twin, as it stops
``setup.py`` from building the extension. ``USING_EXTENSION`` tells which twin was taken; both behave
the same (see ``luftpause.tool_calls._tool_calls_py`` for the rules).

The interface, times in seconds on a monotonic clock (``loop.time()``), passed in:

* ``ToolCallTable(ttl_s=DEFAULT_TTL_S, max_entries=DEFAULT_MAX_ENTRIES)`` with
  ``remember(run_id, ids, now) -> None``, ``lookup(ids, now) -> str | None``,
  ``prune(now) -> int``, ``len(table)``, ``evictions``, ``ttl_s``, ``max_entries``;
* ``request_tool_call_ids(messages) -> list[str]``: the ids of a request's latest tool round, to
  look up;
* ``completion_tool_call_ids(completion) -> list[str]``: the ids a non-streamed ``chat.completion``
  emitted, to remember (a stream's are ``SSEScanner.tool_call_ids``);
* ``DEFAULT_TTL_S`` (1800 s), ``DEFAULT_MAX_ENTRIES`` (1,000,000), ``MAX_LOOKUP_IDS`` (64).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL_S",
    "MAX_LOOKUP_IDS",
    "NO_EXTENSIONS",
    "USING_EXTENSION",
    "ToolCallTable",
    "completion_tool_call_ids",
    "request_tool_call_ids",
]

NO_EXTENSIONS = os.environ.get("LUFTPAUSE_NO_EXTENSIONS", "") not in ("", "0")
"""True when the pure twin is forced (read once, at import)."""

USING_EXTENSION: bool

if TYPE_CHECKING:
    from luftpause.tool_calls._tool_calls_py import (
        DEFAULT_MAX_ENTRIES,
        DEFAULT_TTL_S,
        MAX_LOOKUP_IDS,
        ToolCallTable,
        completion_tool_call_ids,
        request_tool_call_ids,
    )
elif NO_EXTENSIONS:
    from luftpause.tool_calls._tool_calls_py import (
        DEFAULT_MAX_ENTRIES,
        DEFAULT_TTL_S,
        MAX_LOOKUP_IDS,
        ToolCallTable,
        completion_tool_call_ids,
        request_tool_call_ids,
    )

    USING_EXTENSION = False
else:
    try:
        from luftpause.tool_calls._tool_calls_c import (
            DEFAULT_MAX_ENTRIES,
            DEFAULT_TTL_S,
            MAX_LOOKUP_IDS,
            ToolCallTable,
            completion_tool_call_ids,
            request_tool_call_ids,
        )

        USING_EXTENSION = True
    except ImportError:
        from luftpause.tool_calls._tool_calls_py import (
            DEFAULT_MAX_ENTRIES,
            DEFAULT_TTL_S,
            MAX_LOOKUP_IDS,
            ToolCallTable,
            completion_tool_call_ids,
            request_tool_call_ids,
        )

        USING_EXTENSION = False
