"""The routes of the two front doors besides Chat Completions: what a Messages or Responses request
becomes before it is admitted, and each API's error shape.

``POST /v1/messages`` (Anthropic Messages; ``?beta=true``, which Claude Code adds, is ignored) and
``POST /v1/responses`` (OpenAI Responses) are scheduled like chat turns (the route in ``app.py``
reads the body, ``intake.turns`` makes the turn, the scheduler places it). What differs is planned
here, once per request, by :meth:`FrontDoors.plan`:

* **Native**: a replica whose ``[[replicas]] apis`` names the request's API gets the client's bytes
  unchanged at the same path, and its answer reaches the client unchanged, its facts read by the
  API's own fact scanner (``apis.facts``). The turn carries that option as a
  :class:`~luftpause.dataplane.turn.Native`; the relay takes it when the scheduler placed the turn
  on such a replica.
  The client's headers are not passed on (no ``anthropic-version`` or ``anthropic-beta``), as on
  the chat route: the engine gets the replica's key and the ``traceparent``.
* **Translated**: a replica that does not serve the API gets the request translated to Chat
  Completions (``apis.messages_request`` / ``apis.responses_request``) and its answer translated
  back, event by event (a :class:`~luftpause.dataplane.turn.Translation`).

The request is translated only when some replica serving its model needs it, and a request that
cannot be translated (:class:`~luftpause.dataplane.apis.errors.TranslationError`, 400) is refused
then, before it is admitted: the scheduler may place it on any replica serving the model. Where
every replica serving the model speaks the API natively, nothing is translated and nothing is
refused here (the engine judges the request). No replica serving the model: nothing is planned,
and admission answers 404.

Run identity (``run_identity``, in this order): ``x-luftpause-run-id``; the harness's session headers
(``apis.sessions``: Claude Code's ``X-Claude-Code-Session-Id`` and ``-Agent-Id``, Codex's
``thread-id``); the tool ids the request echoes (:attr:`Planned.echoed_ids`: ``tool_use_id`` of
``tool_result`` blocks, ``call_id`` of ``function_call_output`` items) that an earlier answer of a
run on this dataplane emitted; the session named in the body (Claude Code's
``metadata.user_id``, a Responses ``prompt_cache_key``); else a new run.

Errors on these routes take the API's shape (:func:`error_body`), for every case of the failure
contract: Anthropic's ``{"type": "error", "error": {"type", "message"}}`` and OpenAI's
``{"error": {"message", "type", "param", "code"}}``, the status unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from luftpause.config import ReplicaConfig
from luftpause.dataplane.apis.errors import Api, TranslationError, engine_refusal_body
from luftpause.dataplane.apis.errors import error_body as api_error_body
from luftpause.dataplane.apis.facts import MessagesScanner, ResponsesScanner, message_facts, response_facts
from luftpause.dataplane.apis.messages_request import messages_to_chat, tool_result_ids
from luftpause.dataplane.apis.messages_stream import MessagesStream, completion_to_message
from luftpause.dataplane.apis.responses_request import call_output_ids, responses_to_chat
from luftpause.dataplane.apis.responses_stream import ResponsesStream, completion_to_response
from luftpause.dataplane.errors import DataplaneError, EngineError, NotFound
from luftpause.dataplane.turn import Native, Translation, new_id

__all__ = [
    "COUNT_TOKENS_PATH",
    "MESSAGES_PATH",
    "RESPONSES_PATH",
    "CountPlan",
    "FrontDoors",
    "Planned",
    "api_of",
    "error_body",
]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
TOKENIZE_PATH = "/tokenize"
RESPONSES_PATH = "/v1/responses"
_PATHS: dict[Api, str] = {"messages": MESSAGES_PATH, "responses": RESPONSES_PATH}


def api_of(path: str, anthropic_version: bytes | None = None) -> Api | None:
    """The front door whose error shape answers a request for ``path``: ``"messages"`` for
    ``/v1/messages`` and below it (``/v1/messages/count_tokens`` too),
    and for any other ``/v1`` route asked by an Anthropic client (one that sends
    ``anthropic-version``, as ``client.models.retrieve`` does); ``"responses"`` for
    ``/v1/responses`` and below; else ``None`` (the chat route's shape)."""
    for api, route in _PATHS.items():
        if path == route or path.startswith(route + "/"):
            return api
    if anthropic_version and path.startswith("/v1/"):
        return "messages"
    return None


def error_body(api: Api, error: DataplaneError) -> bytes:
    """``error`` (any of the dataplane's, with its status) in ``api``'s shape; a
    :class:`TranslationError` names the field at fault as ``param`` (Responses)."""
    param = error.param if isinstance(error, TranslationError) else None
    return api_error_body(api, error.status, str(error), param)


@dataclass(frozen=True, slots=True)
class Planned:
    """What a front-door request becomes: ``model`` (as the client named it); ``body``, sent to
    ``/v1/chat/completions`` when translated (the client's bytes when nothing was translated);
    ``translation`` (None: none needed, or no replica serves the model); ``native`` (None: no
    replica of the model serves the API); ``echoed_ids``: the tool ids of the request's latest
    tool round, for run identity."""

    model: str
    body: bytes
    translation: Translation | None
    native: Native | None
    echoed_ids: list[str]


@dataclass(frozen=True, slots=True)
class CountPlan:
    """Where ``POST /v1/messages/count_tokens`` asks (``luftpause.dataplane.server.token_count``):
    ``replica`` (its name), ``path`` on it and ``body``; ``native``: the replica speaks Messages and
    gets the client's request unchanged (else the engine's ``/tokenize`` in vLLM's chat form)."""

    replica: str
    path: str
    body: bytes
    native: bool


def _completion(body: bytes) -> dict[str, Any]:
    """An engine's whole answer (a ``chat.completion``) parsed; :class:`EngineError` (the turn
    fails, 502) for one that is not a JSON object, which cannot be translated."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise EngineError("its answer is not JSON, so it cannot be translated") from None
    if not isinstance(doc, dict):
        raise EngineError("its answer is not a JSON object, so it cannot be translated")
    return doc


class FrontDoors:
    """Plans the Messages and Responses routes' turns against the configured replicas.

    ``FrontDoors(replicas, clock=time.time)``: ``clock`` gives the Unix time (seconds) a Response's
    ``created_at`` says."""

    def __init__(self, replicas: Sequence[ReplicaConfig], clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._serving: dict[str, list[ReplicaConfig]] = {}
        for replica in replicas:
            if replica.kind == "generative":
                for model in replica.models:
                    self._serving.setdefault(model, []).append(replica)

    def plan(self, api: Api, payload: dict[str, Any], raw: bytes, model: str) -> Planned:
        """The plan for one request of ``api`` (its parsed ``payload``, its bytes ``raw``, its
        ``model``); raises :class:`TranslationError` (400) when a replica serving the model needs a
        translation the request cannot have."""
        replicas = self._serving.get(model, [])
        native = None
        if any(api in replica.apis for replica in replicas):
            if api == "messages":
                native = Native(api, MESSAGES_PATH, raw, MessagesScanner, message_facts)
            else:
                native = Native(api, RESPONSES_PATH, raw, ResponsesScanner, response_facts)
        echoed = tool_result_ids(payload) if api == "messages" else call_output_ids(payload)
        if not any(api not in replica.apis for replica in replicas):
            return Planned(model, raw, None, native, echoed)
        if api == "messages":
            body, translation = self._messages(payload)
        else:
            body, translation = self._responses(payload)
        return Planned(model, body, translation, native, echoed)

    def count_plan(self, payload: dict[str, Any], raw: bytes, model: str) -> tuple[ReplicaConfig, CountPlan]:
        """Where to count the tokens of a count_tokens request (its ``payload``, bytes ``raw``,
        ``model``): the first replica serving the model, at its ``/tokenize`` (one that serves no
        Chat Completions: at its own count_tokens route). Raises :class:`NotFound` (404) when none
        does, :class:`TranslationError` (400) for a request that cannot be translated."""
        replicas = self._serving.get(model)
        if not replicas:
            raise NotFound(f"no replica serves model {model!r}")
        replica = replicas[0]
        if "chat" not in replica.apis:  # a replica of Messages alone counts for itself
            return replica, CountPlan(replica.name, COUNT_TOKENS_PATH, raw, True)
        if "max_tokens" in payload:
            raise TranslationError("'max_tokens' is not a field of a count_tokens request", "max_tokens")
        chat = messages_to_chat({**payload, "max_tokens": 1, "stream": False}).body
        tokenize: dict[str, Any] = {
            "model": model,
            "messages": chat["messages"],
            "add_generation_prompt": True,
        }
        for key in ("tools", "chat_template_kwargs"):
            if key in chat:
                tokenize[key] = chat[key]
        return replica, CountPlan(replica.name, TOKENIZE_PATH, orjson.dumps(tokenize), False)

    @staticmethod
    def _messages(payload: dict[str, Any]) -> tuple[bytes, Translation]:
        turn = messages_to_chat(payload)
        message_id = f"msg_{new_id()}"

        def whole(body: bytes) -> bytes:
            message = completion_to_message(_completion(body), turn.model, message_id, turn.stop_sequences)
            return orjson.dumps(message)

        translation = Translation(
            stream=lambda: MessagesStream(turn.model, message_id, turn.stop_sequences),
            whole=whole,
            refusal=lambda status, body: engine_refusal_body("messages", status, body),
        )
        return orjson.dumps(turn.body), translation

    def _responses(self, payload: dict[str, Any]) -> tuple[bytes, Translation]:
        turn = responses_to_chat(payload)
        response_id = f"resp_{new_id()}"
        created_at = int(self._clock())

        def whole(body: bytes) -> bytes:
            response = completion_to_response(
                _completion(body), response_id, turn.model, created_at, turn.echo, turn.tool_names
            )
            return orjson.dumps(response)

        translation = Translation(
            stream=lambda: ResponsesStream(response_id, turn.model, created_at, turn.echo, turn.tool_names),
            whole=whole,
            refusal=lambda status, body: engine_refusal_body("responses", status, body),
        )
        return orjson.dumps(turn.body), translation
