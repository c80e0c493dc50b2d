"""Errors of the runtime, each knowing the HTTP status it maps to on ``GET /status``.

MCP tools report them to the harness as tool errors (``isError: true`` with the message as text);
errors inside a sub-agent's loop end the run ``failed`` with the message as its ``error``, or, for a
tool call, go back to the model as the tool's result::

    RuntimeFault (500)
    ├── BadToolInput (400)          a tool argument the schema cannot express (e.g. an empty handle list)
    ├── UnknownRun (404)            no run has this handle: "unknown run handle 'run-…'"
    ├── TurnFailed (502)            an LLM turn through the dataplane failed (HTTP status or connection)
    └── UpstreamUnavailable (502)   an upstream MCP tool server cannot be reached or listed
"""

from __future__ import annotations


class RuntimeFault(Exception):
    """Base: ``status`` is the HTTP status, ``str(err)`` the message shown to the client."""

    status = 500


class BadToolInput(RuntimeFault):
    status = 400


class UnknownRun(RuntimeFault):
    """No run has ``handle``; the message names it."""

    status = 404

    def __init__(self, handle: str) -> None:
        super().__init__(f"unknown run handle {handle!r}")
        self.handle = handle


class TurnFailed(RuntimeFault):
    """An LLM turn failed: a non-429 HTTP status from the dataplane, or no connection at all."""

    status = 502


class UpstreamUnavailable(RuntimeFault):
    """An upstream MCP server (named in the message) could not be connected to or listed."""

    status = 502
