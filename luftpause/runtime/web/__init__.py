"""The runtime's HTTP edge, besides ``/mcp`` itself.

Owns: the bearer token and the JSON error body (:mod:`.auth`), ``GET /status`` with its CORS and
the JSON answers of routing errors (:mod:`.status`), the monitor page and its routes
(:mod:`.monitor`, ``monitor.html``).

May import: :mod:`luftpause.runtime.errors`, :mod:`luftpause.runtime.runs`,
:mod:`luftpause.runtime.pods`, :mod:`luftpause.config`.
"""
