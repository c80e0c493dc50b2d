"""Pick the SSE event scanner: the compiled twin if it was built, else the pure-Python one.

``LUFTPAUSE_NO_EXTENSIONS`` (any value but empty or ``0``) forces the pure twin, as it stops
``setup.py`` from building the extension. ``USING_EXTENSION`` tells which twin was taken; both behave the same
(see ``luftpause.dataplane._sse_py`` for the interface). ``DEFAULT_MAX_EVENT_BYTES`` (16 MiB) is the
default bound on what a scanner holds of one event: ``SSEScanner(keep_events=False,
max_event_bytes=DEFAULT_MAX_EVENT_BYTES, choices=1)``, ``choices`` being how many choices the
request asked for (its ``n``).

What a scanner reports, read from its attributes: ``first_token_seen``, ``finish_reason``,
``choices_finished`` (every choice asked for gave its finish reason),
``saw_tool_calls``, ``tool_call_ids``, ``prompt_tokens``, ``completion_tokens``, ``done``, ``error``
(the message, at most 500 characters, of the first error event an engine sent in the stream -- a
payload with a top-level ``"error"`` key, or ``"object": "error"`` -- else ``None``; an error does
not change ``done`` or ``finish_reason``, the caller decides the turn failed), ``event_count``,
``events``, ``oversized_events``, ``buffered_bytes``, ``max_event_bytes``, ``choices``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "NO_EXTENSIONS", "USING_EXTENSION", "SSEScanner"]

NO_EXTENSIONS = os.environ.get("LUFTPAUSE_NO_EXTENSIONS", "") not in ("", "0")
"""True when the pure twin is forced (read once, at import)."""

USING_EXTENSION: bool
DEFAULT_MAX_EVENT_BYTES: int

if TYPE_CHECKING:
    from luftpause.dataplane._sse_py import DEFAULT_MAX_EVENT_BYTES, SSEScanner
elif NO_EXTENSIONS:
    from luftpause.dataplane._sse_py import DEFAULT_MAX_EVENT_BYTES, SSEScanner

    USING_EXTENSION = False
else:
    try:
        from luftpause.dataplane._sse_c import DEFAULT_MAX_EVENT_BYTES, SSEScanner

        USING_EXTENSION = True
    except ImportError:
        from luftpause.dataplane._sse_py import DEFAULT_MAX_EVENT_BYTES, SSEScanner

        USING_EXTENSION = False
