"""The runtime's HTTP edge, besides ``/mcp`` itself.

Owns: the bearer token and the JSON error body (:mod:`.auth`), ``GET /status`` with its CORS and
the JSON answers of routing errors (:mod:`.status`), JSON-RPC error bodies and accepted hosts on
``/mcp`` (:mod:`.mcp_errors`), the monitor page and its routes
(:mod:`.monitor`, ``monitor.html``), ``GET /metrics`` and ``/readyz``'s checks (:mod:`.metrics`).

May import: :mod:`luftpause.runtime.errors`, :mod:`luftpause.runtime.runs`,
:mod:`luftpause.runtime.pods`, :mod:`luftpause.config`, :mod:`luftpause.observe.metrics`,
:mod:`luftpause.serving.health`. What the loop counts it is given, through a protocol.
"""
