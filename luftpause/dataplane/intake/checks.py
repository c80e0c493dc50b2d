"""What a request must be before it becomes a turn, checked the same way on every route: its body's
size (413) and encoding (415), JSON with a ``model`` (400), output tokens within the model's cap
(400), its method (405), and the bounds of a run id and a caller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from luftpause.dataplane.asgi import Exchange
from luftpause.dataplane.errors import BadRequest, MethodNotAllowed, PayloadTooLarge, UnsupportedMediaType
from luftpause.dataplane.turn import RUN_ID_HEADER

__all__ = [
    "CALLER_MAX_BYTES",
    "MAX_BODY_BYTES",
    "RUN_ID_MAX_BYTES",
    "acceptable_run_id",
    "allow",
    "client_run_id",
    "header_of",
    "json_with_model",
    "read_body",
    "refuse_encoded_body",
    "refuse_over_token_cap",
    "truncate_caller",
]

_RUN_ID = RUN_ID_HEADER.encode()

MAX_BODY_BYTES = 32 * 1024 * 1024
CALLER_MAX_BYTES = 128
RUN_ID_MAX_BYTES = 256


def acceptable_run_id(value: str | None) -> bool:
    """A run id we take: present, at most ``RUN_ID_MAX_BYTES`` bytes of UTF-8."""
    return value is not None and 0 < len(value.encode()) <= RUN_ID_MAX_BYTES


def client_run_id(exchange: Exchange) -> str | None:
    """The client's own ``x-luftpause-run-id``, when it is one we would accept, for error answers."""
    try:
        value = exchange.header(_RUN_ID)
    except BadRequest:
        return None
    return value if acceptable_run_id(value) else None


def truncate_caller(caller: str) -> str:
    """At most ``CALLER_MAX_BYTES`` bytes of UTF-8, never cutting a character in half."""
    raw = caller.encode()
    if len(raw) <= CALLER_MAX_BYTES:
        return caller
    return raw[:CALLER_MAX_BYTES].decode(errors="ignore")


async def read_body(exchange: Exchange) -> bytes:
    """The request body, refused with 413 as soon as it passes ``MAX_BODY_BYTES``, and with 415
    before it is read when it comes encoded (see :func:`refuse_encoded_body`)."""
    refuse_encoded_body(exchange)
    declared = exchange.headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is {declared.decode()} bytes; the limit is {MAX_BODY_BYTES}")
    return await exchange.read_body(MAX_BODY_BYTES, _too_large)


def header_of(exchange: Exchange) -> Callable[[str], str | None]:
    """``exchange``'s headers as ``apis.sessions`` reads them: by lower-case name, ``None`` when
    absent (:class:`BadRequest` for a value that is not ASCII)."""
    return lambda name: exchange.header(name.encode())


def _too_large() -> Exception:
    return PayloadTooLarge(f"request body is over the limit of {MAX_BODY_BYTES} bytes")


def refuse_encoded_body(exchange: Exchange) -> None:
    """Raise :class:`UnsupportedMediaType` (415) when the request's ``Content-Encoding`` (RFC 9110
    section 8.4) names a coding other than ``identity``: the dataplane reads the body as JSON and
    sends the engine its bytes, and decodes no coding (a gzip body was refused as not UTF-8)."""
    value = exchange.headers.get(b"content-encoding")
    if value is None:
        return
    codings = [coding.strip().lower() for coding in value.split(b",")]
    if all(coding in (b"", b"identity") for coding in codings):
        return
    named = value.decode("ascii", "backslashreplace").strip()
    raise UnsupportedMediaType(
        f"request body has Content-Encoding: {named}; the dataplane does not decode request bodies: "
        "send the body unencoded (Content-Encoding: identity, or no Content-Encoding header)"
    )


def json_with_model(body: bytes) -> tuple[dict[str, Any], str]:
    """A request body as a JSON object and its non-empty ``model``; :class:`BadRequest` otherwise."""
    try:
        payload: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string")
    return payload, model


def allow(path: str, method: str, *allowed: str) -> None:
    if method not in allowed:
        raise MethodNotAllowed(f"{path} takes {', '.join(allowed)}, not {method}", allow=", ".join(allowed))


TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""How each front door names a turn's output tokens: Chat Completions ``max_tokens`` (deprecated)
and ``max_completion_tokens``, Anthropic Messages ``max_tokens``, OpenAI Responses
``max_output_tokens``."""


def refuse_over_token_cap(payload: dict[str, Any], model: str, cap: int | None) -> None:
    """:class:`BadRequest` (400) when one of :data:`TOKEN_FIELDS` in ``payload`` asks for more than
    ``cap`` tokens (``None``: no cap); an integer written as a float counts as that integer, as an
    engine reads it. Other values are left for the engine to judge."""
    if cap is None:
        return
    for name in TOKEN_FIELDS:
        value = payload.get(name)
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is int and value > cap:
            raise BadRequest(
                f"'{name}' is {value}: model {model!r} takes at most {cap} output tokens "
                "([dataplane] max_tokens, else its replicas' context length; docs/failover.md)"
            )
