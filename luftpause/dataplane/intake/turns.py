"""What a ``/v1`` request becomes before it is admitted: whether it may come in at all, its service
class and caller, its run, and the :class:`~luftpause.dataplane.turn.Turn` the relay forwards
(docs/architecture.md "The proxy", "Auth", "Front-door APIs").

Access (:mod:`luftpause.auth.callers`): the request's ``Authorization``, or its ``x-api-key`` as a
bearer token (what the Anthropic clients send), must be the token or a caller key (401 else). The
class is ``x-luftpause-class`` (``interactive`` | ``batch``; absent: interactive; 400 for another);
the caller ``x-luftpause-caller`` cut to 128 bytes; with caller keys, the key's caller narrowed by
the header and a class the key may use (absent: its first), 403 otherwise. The run comes from
:class:`~luftpause.dataplane.intake.run_identity.RunIdentity`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from luftpause.auth.callers import Access, CallerRefused
from luftpause.dataplane.apis.errors import Api
from luftpause.dataplane.asgi import Exchange
from luftpause.dataplane.errors import BadRequest, Forbidden, Unauthorized
from luftpause.dataplane.intake.checks import (
    header_of,
    json_with_model,
    refuse_over_token_cap,
    truncate_caller,
)
from luftpause.dataplane.intake.front_doors import FrontDoors
from luftpause.dataplane.intake.run_identity import RunIdentity
from luftpause.dataplane.turn import Turn
from luftpause.tool_calls import request_tool_call_ids
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["CLASSES", "TurnIntake", "requested_choices"]

CLASSES = {"interactive": pb.INTERACTIVE, "batch": pb.BATCH}
"""``x-luftpause-class`` values and the ``ServiceClass`` each is."""

_CALLER = b"x-luftpause-caller"
_CLASS = b"x-luftpause-class"
_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
_X_API_KEY = b"x-api-key"


class TurnIntake:
    """``TurnIntake(access, identity, now)``: who may use the ``/v1`` routes and as which caller
    (``access``), which run a turn belongs to (``identity``), and ``now()``, the loop's time in
    seconds (a turn's ``arrived``, a run's last activity).

    ``token_cap(model)``: the most output tokens a turn of ``model`` may ask for (``None``: no
    cap), refused 400 beyond it.

    Every method raises a :class:`~luftpause.dataplane.errors.DataplaneError` (401, 403, 400) for a
    request that may not become a turn; none reads the body (the routes read it: 413, 415)."""

    def __init__(
        self,
        access: Access,
        identity: RunIdentity,
        now: Callable[[], float],
        token_cap: Callable[[str], int | None] = lambda model: None,
    ) -> None:
        self.access = access
        self.identity = identity
        self._now = now
        self._token_cap = token_cap
        """Model -> the most output tokens a turn of it may ask for (``None``: no cap)."""

    def credential(self, exchange: Exchange) -> bytes | None:
        """The request's ``Authorization`` value, or its ``x-api-key`` as ``Bearer <key>`` (the
        Anthropic clients' way to send a key)."""
        given = exchange.headers.get(b"authorization")
        if not given and (key := exchange.headers.get(_X_API_KEY)):
            given = b"Bearer " + key
        return given

    def authorize(self, exchange: Exchange) -> None:
        """:class:`Unauthorized` (401, with its challenge) unless the request's credential is one
        ``access`` takes (any, when no token and no caller keys are configured)."""
        if not self.access.allows(self.credential(exchange)):
            raise Unauthorized(self.access.refusal())

    def who(self, exchange: Exchange) -> tuple[int, str]:
        """A turn's ``ServiceClass`` and caller: ``x-luftpause-class`` (absent: interactive) and
        ``x-luftpause-caller`` (cut to ``CALLER_MAX_BYTES``); with caller keys, the key's caller
        narrowed by the header and a class the key may use (absent: its first), 403 otherwise
        (:mod:`luftpause.auth.callers`). :class:`BadRequest` for a class that is neither."""
        class_name = exchange.header(_CLASS)
        if class_name is not None and class_name not in CLASSES:
            raise BadRequest(f"x-luftpause-class must be 'interactive' or 'batch', not {class_name!r}")
        try:
            class_name, caller = self.access.resolve(
                self.credential(exchange), class_name, exchange.header(_CALLER)
            )
        except CallerRefused as exc:
            raise (Unauthorized if exc.status == 401 else Forbidden)(str(exc)) from None
        return CLASSES[class_name], truncate_caller(caller)

    def chat_turn(self, exchange: Exchange, body: bytes) -> Turn:
        """A ``POST /v1/chat/completions`` request (its ``body``, read) as a turn: JSON with a
        ``model`` and a ``messages`` array (:class:`BadRequest` otherwise), its run from the header
        or the ``tool_call_id`` values its messages answer. Its bytes go to the engine unchanged."""
        payload, model = json_with_model(body)
        messages = payload.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("'messages' must be an array")
        refuse_over_token_cap(payload, model, self._token_cap(model))
        service_class, caller = self.who(exchange)
        now = self._now()
        run_id, new_run, ask_ids = self.identity.run_of(
            header_of(exchange), service_class, caller, now, lambda: request_tool_call_ids(messages)
        )
        return _turn(
            exchange,
            model,
            (service_class, caller),
            body,
            arrived=now,
            run_id=run_id,
            new_run=new_run,
            ask_ids=ask_ids,
            client_priority="priority" in payload,
            choices=requested_choices(payload),
        )

    def front_door_turn(self, exchange: Exchange, api: Api, body: bytes, front_doors: FrontDoors) -> Turn:
        """A ``POST /v1/messages`` or ``POST /v1/responses`` request (``api``, its ``body`` read)
        as a turn planned by ``front_doors`` (the replicas as they are now): relayed natively or
        translated; its run from the header, the harness's session signals or its echoed tool ids.
        Raises :class:`~luftpause.dataplane.apis.errors.TranslationError` (400) for a request a
        replica of its model would need translated and cannot be."""
        payload, model = json_with_model(body)
        refuse_over_token_cap(payload, model, self._token_cap(model))
        planned = front_doors.plan(api, payload, body, model)
        service_class, caller = self.who(exchange)
        now = self._now()
        run_id, new_run, ask_ids = self.identity.run_of(
            header_of(exchange), service_class, caller, now, lambda: planned.echoed_ids, payload
        )
        return _turn(
            exchange,
            model,
            (service_class, caller),
            planned.body,
            arrived=now,
            run_id=run_id,
            new_run=new_run,
            ask_ids=ask_ids,
            translation=planned.translation,
            native=planned.native,
        )

    def single_pass_turn(self, exchange: Exchange, body: bytes) -> Turn:
        """A ``/v1/decide`` request: vLLM's classification request, ``{"model": str, "input": str |
        [str, ...]}`` (other keys pass through untouched); :class:`BadRequest` otherwise. It
        belongs to no run (``run_id`` ``""``)."""
        payload, model = json_with_model(body)
        given = payload.get("input")
        if not (
            isinstance(given, str)
            or (isinstance(given, list) and given and all(isinstance(item, str) for item in given))
        ):
            raise BadRequest("'input' must be a string or a non-empty array of strings")
        who = self.who(exchange)
        return _turn(exchange, model, who, body, arrived=self._now(), run_id="", single_pass=True)


def _turn(
    exchange: Exchange,
    model: str,
    who: tuple[int, str],
    body: bytes,
    *,
    arrived: float,
    run_id: str,
    **decided: Any,
) -> Turn:
    """The one constructor of every turn intake makes (generative, front door or single-pass): a
    new turn id, ``who`` (its ``ServiceClass`` and caller, from :meth:`TurnIntake.who`), the
    engine's ``body``, the request's ``traceparent`` and ``tracestate`` as they came, ``arrived``
    (seconds, the loop's clock) and ``run_id`` (``""`` for a single-pass turn); ``decided`` are the
    further :class:`~luftpause.dataplane.turn.Turn` fields its kind sets."""
    service_class, caller = who
    return Turn(
        turn_id=Turn.new_id(),
        run_id=run_id,
        model=model,
        service_class=service_class,
        caller=caller,
        body=body,
        traceparent=exchange.header(_TRACEPARENT),
        tracestate=exchange.header(_TRACESTATE),
        arrived=arrived,
        **decided,
    )


def requested_choices(payload: dict[str, Any]) -> int:
    """How many choices a Chat Completions request asks for: its ``n`` (OpenAI API reference,
    "Create chat completion": an integer, default 1), also when written as a float or a string
    that holds an integer, as an engine that coerces its fields reads it (vLLM's pydantic models);
    else 1 (the engine then refuses the request, or serves one choice). At most ``sys.maxsize``.

    Counting too few would take the first choices' finish reasons for the answer's end; too many
    only makes a stream that ends without ``[DONE]`` count as cut short."""
    n = payload.get("n")
    if type(n) is float and n.is_integer():
        n = int(n)
    elif type(n) is str:
        try:
            n = int(n)
        except ValueError:
            return 1
    return min(n, sys.maxsize) if type(n) is int and n > 1 else 1
