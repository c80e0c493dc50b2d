"""Faults the simulated engine injects on demand, so the dataplane's failure contract can be tested.

A fault is chosen per request, in this order:

1. the request's own extension field ``"luftpause_fault"`` in the JSON body of
   ``POST /v1/chat/completions`` (a proxy that forwards bodies byte-identical lets a test client
   steer the engine through it); ``null`` or absent means no fault;
2. else the engine's configured fault (``EngineSettings.fault``), given to a random fraction
   ``EngineSettings.fault_rate`` of requests, drawn from ``random.Random(EngineSettings.seed)``.

The field's shapes (every key but ``kind`` optional, defaults shown)::

    {"kind": "status", "status": 503, "retry_after": null, "message": "...", "type": "...", "code": 503}
    {"kind": "die_mid_stream", "after_chunks": 2}
    {"kind": "error_mid_stream", "after_chunks": 2, "message": "..."}
    {"kind": "stall", "seconds": 5.0}
    {"kind": "slow", "delay_ms": 50.0}
    {"kind": "close"}

* ``status``: answered at once, before any slot is taken: HTTP ``status`` (400-599) with the body
  ``{"error": {"message", "type", "param": null, "code"}}`` and, when ``retry_after`` is given, a
  ``Retry-After: <seconds>`` header (RFC 9110 section 10.2.3, delay-seconds).
* ``die_mid_stream``: streamed, ``after_chunks`` server-sent events (``data: [DONE]`` never
  counts and is never sent) then the TCP connection is aborted, with no chunked-encoding
  terminator; not streamed, the status line and headers (``Content-Length`` of the whole answer)
  then the abort, so the body never comes.
* ``error_mid_stream``: streamed, ``after_chunks`` events, then an error event as vLLM sends one
  (``data: {"error": {"object": "error", "message", "type", "code": 500}}``), then ``data: [DONE]``
  and a clean end of the stream; not streamed, a 500 with that error body.
* ``stall``: the request takes its slot as usual, then nothing is sent for ``seconds``, not even
  the status line; then the answer goes out normally. A client that leaves while stalled frees the
  slot as any departing client does.
* ``slow``: every server-sent event is its own write, ``delay_ms`` after the previous one (not
  streamed: the body goes out in pieces of ``SLOW_PIECE_BYTES``, ``delay_ms`` apart), on top of
  the decode time.
* ``close``: the request is read, then the connection is closed without any answer.

Any other ``kind``, an unknown key or a value of the wrong type or range is refused with 400 and
the usual error body, whose ``param`` names the field (``luftpause_fault.delay_ms``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

# The name of the request body's extension field.
FIELD = "luftpause_fault"

# Non-streamed answers under a "slow" fault go out in pieces of this many bytes.
SLOW_PIECE_BYTES = 256

# The error "type" a refusal carries when the fault names none, as vLLM and OpenAI name them.
_ERROR_TYPES = {429: "RateLimitError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class FaultSpecError(ValueError):
    """A fault specification that is not one of the shapes above; ``param`` names the bad field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class StatusFault:
    """Refuse at once with HTTP ``status`` and an OpenAI error body; ``retry_after`` in seconds."""

    kind: ClassVar[str] = "status"
    status: int = 503
    retry_after: int | None = None
    message: str | None = None
    type: str | None = None
    code: int | str | None = None

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as vLLM shapes its errors."""
        default_type = "BadRequestError" if self.status < 500 else "InternalServerError"
        return {
            "error": {
                "message": self.message or f"simulated engine fault: status {self.status}",
                "type": self.type or _ERROR_TYPES.get(self.status, default_type),
                "param": None,
                "code": self.status if self.code is None else self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


@dataclass(frozen=True, slots=True)
class DieMidStream:
    """Send ``after_chunks`` server-sent events, then abort the connection."""

    kind: ClassVar[str] = "die_mid_stream"
    after_chunks: int = 2


@dataclass(frozen=True, slots=True)
class ErrorMidStream:
    """Send ``after_chunks`` server-sent events, then an error event and ``[DONE]``."""

    kind: ClassVar[str] = "error_mid_stream"
    after_chunks: int = 2
    message: str = "the engine failed while generating (simulated)"

    def body(self) -> dict[str, Any]:
        return {
            "error": {"object": "error", "message": self.message, "type": "InternalServerError", "code": 500}
        }


@dataclass(frozen=True, slots=True)
class Stall:
    """Once holding a slot, send nothing for ``seconds``, then answer normally."""

    kind: ClassVar[str] = "stall"
    seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class Slow:
    """Write every event on its own, ``delay_ms`` milliseconds apart."""

    kind: ClassVar[str] = "slow"
    delay_ms: float = 50.0


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Read the request, then close the connection without an answer."""

    kind: ClassVar[str] = "close"


Fault = StatusFault | DieMidStream | ErrorMidStream | Stall | Slow | CloseConnection

KINDS: dict[str, type[Fault]] = {
    cls.kind: cls for cls in (StatusFault, DieMidStream, ErrorMidStream, Stall, Slow, CloseConnection)
}


def parse_fault(spec: Any, where: str = FIELD) -> Fault:
    """A :data:`Fault` from its JSON shape (see the module docstring).

    ``where`` prefixes the field names in errors (``luftpause_fault.status``). Raises
    :class:`FaultSpecError` for anything but those shapes.
    """
    if not isinstance(spec, Mapping):
        raise FaultSpecError(f"'{where}' must be an object with a 'kind'", where)
    kind = spec.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FaultSpecError(
            f"'{where}.kind' must be one of {', '.join(KINDS)}; got {kind!r}", f"{where}.kind"
        )
    allowed = {"kind", *(f.name for f in fields(cls))}
    for key in spec:
        if key not in allowed:
            raise FaultSpecError(
                f"'{where}.{key}' is not a field of a {kind!r} fault (fields: {', '.join(sorted(allowed))})",
                f"{where}.{key}",
            )
    values = {key: value for key, value in spec.items() if key != "kind" and value is not None}
    check = _Checker(values, where)
    if cls is StatusFault:
        return StatusFault(
            status=check.integer("status", 503, low=400, high=599),
            retry_after=check.optional_integer("retry_after", low=0),
            message=check.optional_text("message"),
            type=check.optional_text("type"),
            code=check.code("code"),
        )
    if cls is DieMidStream:
        return DieMidStream(after_chunks=check.integer("after_chunks", 2, low=0))
    if cls is ErrorMidStream:
        message = check.optional_text("message")
        return ErrorMidStream(
            after_chunks=check.integer("after_chunks", 2, low=0),
            **({} if message is None else {"message": message}),
        )
    if cls is Stall:
        return Stall(seconds=check.number("seconds", 5.0))
    if cls is Slow:
        return Slow(delay_ms=check.number("delay_ms", 50.0))
    return CloseConnection()


def parse_fault_option(text: str) -> Fault:
    """The ``--fault`` flag: a kind name (``stall``) or the JSON object of the request field.

    Raises :class:`FaultSpecError` (a ``ValueError``) for bad JSON or a bad shape.
    """
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FaultSpecError(f"'--fault' is not valid JSON: {exc}", "--fault") from None
    else:
        spec = {"kind": text}
    return parse_fault(spec, "--fault")


class FaultDice:
    """Which requests get the configured fault: each with probability ``rate``, from ``seed``.

    The same seed and the same request order give the same faulted requests.
    """

    def __init__(self, fault: Fault | None, rate: float, seed: int) -> None:
        self._fault = fault
        self._rate = rate
        self._random = random.Random(seed)

    def draw(self) -> Fault | None:
        """The configured fault for the next request, or ``None``."""
        if self._fault is None:
            return None
        # random() is in [0, 1): a rate of 1 always hits, a rate of 0 never does.
        return self._fault if self._random.random() < self._rate else None


class _Checker:
    """Typed reads of a fault's fields, each refusing with the field's full name."""

    def __init__(self, values: Mapping[str, Any], where: str) -> None:
        self._values = values
        self._where = where

    def _fail(self, key: str, expected: str) -> FaultSpecError:
        return FaultSpecError(
            f"'{self._where}.{key}' must be {expected}; got {self._values[key]!r}", f"{self._where}.{key}"
        )

    def integer(self, key: str, default: int, low: int, high: int | None = None) -> int:
        value = self._values.get(key, default)
        # bool is an int in Python, never in JSON: refuse true for an integer field.
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value < low
            or (high is not None and value > high)
        ):
            span = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise self._fail(key, f"an integer {span}")
        return value

    def optional_integer(self, key: str, low: int) -> int | None:
        return self.integer(key, low, low) if key in self._values else None

    def number(self, key: str, default: float) -> float:
        value = self._values.get(key, default)
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            raise self._fail(key, "a finite number, not negative")
        return float(value)

    def optional_text(self, key: str) -> str | None:
        value = self._values.get(key)
        if value is not None and not isinstance(value, str):
            raise self._fail(key, "a string")
        return value

    def code(self, key: str) -> int | str | None:
        value = self._values.get(key)
        if value is not None and (not isinstance(value, (int, str)) or isinstance(value, bool)):
            raise self._fail(key, "an integer or a string")
        return value
