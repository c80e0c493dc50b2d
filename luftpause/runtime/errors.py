"""Errors of the runtime, each with the HTTP status it would map to (``status``); only the
monitor's routes answer HTTP with it today (:mod:`luftpause.runtime.web.monitor`).

MCP tools report them to the harness as tool errors (``isError: true`` with the message as text);
errors inside a sub-agent's loop end the run ``failed`` with the message as its ``error``, or, for a
tool call, go back to the model as the tool's result::

    RuntimeFault (500)
    ├── BadToolInput (400)          a tool argument the schema cannot express (e.g. an empty handle list)
    ├── UnknownRun (404)            no run has this handle: "unknown run handle 'run-…'"
    ├── ExpiredRun (410)            the run finished and was dropped after its retention time
    ├── UnknownModel (404)          ``spawn`` names a model no generative replica serves
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


class UnknownModel(RuntimeFault):
    """``spawn`` asked for a model that no generative replica serves; the message names it and the
    models that are served."""

    status = 404

    def __init__(self, model: str, served: list[str]) -> None:
        listed = ", ".join(map(repr, served)) or "none"
        super().__init__(f"no generative replica serves model {model!r}; models served: {listed}")
        self.model = model


class TurnFailed(RuntimeFault):
    """An LLM turn failed: a non-429 HTTP status from the dataplane, or no connection at all."""

    status = 502


class UpstreamUnavailable(RuntimeFault):
    """An upstream MCP server (named in the message) could not be connected to or listed."""

    status = 502
