"""One answer's relay as a state machine, with no IO (the h11 / aioquic habit).

The engine's body goes in as each read brought it, cut anywhere (:meth:`AnswerStream.receive`);
out come the bytes to send the client (:meth:`AnswerStream.data_to_send`), the facts to report
(:meth:`AnswerStream.facts`: :class:`FirstToken`, then the outcome) and the typed outcome
(:attr:`AnswerStream.outcome`: :class:`Finished` or :class:`Failed`). No socket, no clock, no
await: the loop around it (``relay.loop``) moves bytes and calls one report function, so every
split of every stream can be tested here directly.

The rules of a streamed answer's end (docs/architecture.md "Failure contract"):

1. A readable answer is whole at its last event (``data: [DONE]``, or the native API's own last
   event): the outcome is decided then, whether the engine's body has ended or not. The read that
   carried it goes to the client as it came (a relayed body is not cut mid-read); later reads are
   not taken in.
2. A body that ends cleanly before that event has answered whole only if every choice the turn
   asked for (``n``) said its finish reason, or it carried an error event; else the answer was cut
   short: :class:`Failed`, ``broken`` (the client's connection is aborted, never ended cleanly).
   A finish reason alone never ends the answer: with n > 1 choices the first is not the last.
3. An error event inside the stream (vLLM's and SGLang's way to fail mid-answer) ends as the engine
   ended it: the client's stream ends cleanly, the turn :class:`Failed` (not ``broken``).
4. A body in an encoding the relay does not decode is relayed unread: :class:`Finished` with no
   facts when it ends cleanly.
5. The engine failing (:meth:`AnswerStream.engine_failed`), the body failing to decode, or a
   translation that cannot go on: :class:`Failed`, ``broken``. The client leaving
   (:meth:`AnswerStream.client_left`) before the outcome: :class:`Failed` (``client
   disconnected``); after it the outcome stands.
6. There is one outcome: once it is decided nothing changes it, and it is the last fact.

A turn with a :class:`~luftpause.dataplane.turn.StreamTranslation` (a Messages or Responses client
of a Chat Completions engine) is translated here too: the client's bytes are the translation's, the
facts still come from the engine's own stream (the translation's scanner). Whole answers and
refusals go through :func:`whole_answer` and :func:`refusal_body`, the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from luftpause.dataplane.relay.upstream import EngineError
from luftpause.dataplane.sse import SSEScanner
from luftpause.dataplane.turn import Facts, StreamTranslation, Translation
from luftpause.tool_calls import completion_tool_call_ids

__all__ = [
    "AnswerStream",
    "Decoder",
    "Fact",
    "Failed",
    "Finished",
    "FirstToken",
    "Outcome",
    "WholeAnswer",
    "completion_facts",
    "decoder_for",
    "refusal_body",
    "whole_answer",
]


class Decoder(Protocol):
    """A streaming decoder of a ``Content-Encoding`` (``zlib.decompressobj``'s interface)."""

    def decompress(self, data: bytes, /) -> bytes: ...

    def flush(self) -> bytes: ...


def decoder_for(encoding: bytes | None) -> Decoder | Literal[False] | None:
    """A streaming decoder for a ``Content-Encoding`` the relay decodes, ``None`` for none (absent
    or ``identity``), ``False`` for one it passes through unread.

    Decoded: ``gzip`` / ``x-gzip`` and ``deflate`` (zlib, which always exists; zlib or gzip
    framing). Anything else (``br``, ``zstd``, ``compress``, ``x-foo``, a list of codings) passes
    to the client untouched *with* its header, never half of each. The engine was asked for
    ``identity``, so either is an engine ignoring ``Accept-Encoding``.
    """
    if encoding is None:
        return None
    coding = encoding.strip().lower()
    if coding in (b"", b"identity"):
        return None
    if coding in (b"gzip", b"x-gzip", b"deflate"):
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: gzip or zlib header, detected
    return False


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The answer's first token came (a fact, reported once, when it came)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The answer is whole. ``finish_reason`` (``""``: not said), whether it emitted tool calls,
    its prompt / completion / cached prompt tokens (``-1``: not reported), the tool-call ids a next
    turn may echo (the engine's, and those a translation gave the client), the engine's completion
    id and the model that answered (``None``: not said)."""

    finish_reason: str = ""
    tool_calls: bool = False
    prompt_tokens: int = -1
    completion_tokens: int = -1
    tool_call_ids: tuple[str, ...] = ()
    cached_tokens: int = -1
    response_id: str | None = None
    response_model: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The answer failed: ``error`` (a message for the scheduler, the logs and the span).
    ``broken``: the client's stream must be aborted, not ended cleanly (everything but an error
    event the engine itself sent in its stream)."""

    error: str
    broken: bool = True


Outcome = Finished | Failed
Fact = FirstToken | Finished | Failed
"""What a relay reports: the first token when it comes, then the outcome, once."""

_CUT_SHORT = "engine closed the stream before it finished"


class AnswerStream:
    """One streamed (SSE) answer being relayed.

    ``AnswerStream(choices=1, decoder=None, translation=None, scanner=None)``: ``choices``, how many
    choices the request asked for (its ``n``); ``decoder``, from :func:`decoder_for` the answer's
    ``Content-Encoding``; ``translation``, the turn's stream translation (its scanner reads the
    facts); ``scanner``, what makes the fact scanner when there is no translation (a natively
    served API's; else the Chat Completions :class:`~luftpause.dataplane.sse.SSEScanner` for
    ``choices``). Raises :class:`EngineError` for a translation
    of a body the relay cannot read (an encoding it does not decode).
    """

    __slots__ = ("_decoder", "_facts", "_out", "_readable", "_scan", "_translation", "outcome", "scanner")

    # Per read, on the hot path: no list is made for an empty result, and a read's bytes are kept as
    # they are (one read, one piece) until taken.

    def __init__(
        self,
        choices: int = 1,
        decoder: Decoder | Literal[False] | None = None,
        translation: StreamTranslation | None = None,
        scanner: Callable[[], SSEScanner] | None = None,
    ) -> None:
        if translation is not None and decoder is False:
            raise EngineError("its stream is in an encoding the relay cannot read to translate")
        self._translation = translation
        if translation is not None:
            self.scanner = translation.scanner
        elif scanner is not None:
            self.scanner = scanner()
        else:
            self.scanner = SSEScanner(choices=choices)
        self._readable = decoder is not False
        self._decoder = decoder or None
        self._scan = self.scanner.feed if self._readable and translation is None else None
        self._out = b""
        self._facts: list[Fact] = []
        self.outcome: Outcome | None = None
        """``None`` while the answer goes on; then its :class:`Finished` or :class:`Failed`."""

    @property
    def answered(self) -> bool:
        """The answer's last event came: the engine's connection may be kept for another request
        once its body ends (not at a finish reason: with n > 1 choices the first is not the last)."""
        return self._readable and self.scanner.done

    @property
    def finishing(self) -> bool:
        """Every choice said its finish reason but the body has not ended: its end is all that may
        still come, and a loop that reads it before sending sends the last events and the end in
        one piece (a send costs more than a turn of the loop). Never before the answer is over:
        events go out as they come, the first token first of all."""
        return (
            self.outcome is None
            and self._readable
            and self._decoder is None
            and self.scanner.choices_finished
        )

    def receive(self, data: bytes, ended: bool = False) -> None:
        """Take the engine's next read ``data`` (maybe empty); ``ended``: the body ended cleanly
        with it. Nothing is taken once the outcome is decided."""
        if self.outcome is not None:
            return
        try:
            decoder = self._decoder
            if decoder is not None:
                data = decoder.decompress(data)
                if ended:
                    data += decoder.flush()
            out = self._take_in(data)
            scanner, readable = self.scanner, self._readable
            if ended and readable and not (scanner.done or scanner.choices_finished or scanner.error):
                # The body ended before the answer did (with n > 1 choices: before every choice
                # said its finish reason): to the client a broken stream, after what came.
                self._send(out)
                self._decide(Failed(_CUT_SHORT))
                return
            if ended or (readable and scanner.done):
                if self._translation is not None:
                    out += self._translation.finish()
                self._send(out)
                self._decide(self._whole())
                return
        except (EngineError, zlib.error) as exc:
            self._decide(Failed(f"engine failed mid-stream: {exc}"))
            return
        except Exception as exc:
            if self._translation is None:
                raise  # a fault of the relay's own, not of the answer
            # The translation gave up (an event it could not translate faithfully).
            self._decide(Failed(f"the answer could not be translated: {type(exc).__name__}: {exc}"))
            return
        self._send(out)

    def engine_failed(self, reason: str) -> None:
        """The engine's body failed (a read error, a timeout) before the outcome: ``broken``."""
        if self.outcome is None:
            self._decide(Failed(f"engine failed mid-stream: {reason}"))

    def client_left(self) -> None:
        """The client went away; before the outcome the turn failed (the engine must stop)."""
        if self.outcome is None:
            self._decide(Failed("client disconnected"))

    def data_to_send(self) -> bytes:
        """The bytes for the client since the last call (maybe ``b""``)."""
        out, self._out = self._out, b""
        return out

    def facts(self) -> Sequence[Fact]:
        """The facts since the last call, in order: :class:`FirstToken` once, then the outcome."""
        facts = self._facts
        if not facts:
            return ()
        self._facts = []
        return facts

    def _send(self, out: bytes) -> None:
        if out:
            self._out = self._out + out if self._out else out

    def _take_in(self, data: bytes) -> bytes:
        """Read the facts of ``data`` (decoded engine bytes) and return what the client gets."""
        translation = self._translation
        if translation is None:
            scan = self._scan
            if scan is not None and data and scan(data):
                self._facts.append(FirstToken())
            return data
        scanner = self.scanner
        seen = scanner.first_token_seen
        out = translation.feed(data)
        if not seen and scanner.first_token_seen:
            self._facts.append(FirstToken())
        return out

    def _decide(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._facts.append(outcome)

    def _whole(self) -> Outcome:
        """The outcome of an answer whose end came (rules 1, 3 and 4)."""
        if not self._readable:
            return Finished()  # unread: only that it ended cleanly is known
        scanner = self.scanner
        if scanner.error is not None:
            return Failed(f"engine error mid-stream: {scanner.error}", broken=False)
        ids = scanner.tool_call_ids
        if self._translation is not None:  # the ids the client was sent, too (it echoes those)
            ids = list(dict.fromkeys([*ids, *self._translation.tool_call_ids]))
        return Finished(
            scanner.finish_reason or "",
            scanner.saw_tool_calls,
            scanner.prompt_tokens,
            scanner.completion_tokens,
            tuple(ids),
            scanner.cached_tokens,
            scanner.response_id,
            scanner.response_model,
        )


@dataclass(frozen=True, slots=True)
class WholeAnswer:
    """A whole (non-streamed) 200 answer as the client gets it: ``body`` and the turn's
    ``outcome``; ``timed``: the dataplane's time-to-first-token histogram counts its whole time
    (a readable generative answer), though no first token is reported to the scheduler, which
    learns a run's cold prefill rate from first tokens and a whole answer's time holds its decode."""

    body: bytes
    outcome: Finished
    timed: bool


def whole_answer(
    body: bytes,
    decoder: Decoder | Literal[False] | None = None,
    translation: Translation | None = None,
    native: Callable[[bytes], Facts] | None = None,
    single_pass: bool = False,
) -> WholeAnswer:
    """A whole answer's ``body`` (as the engine sent it) relayed: decoded, its facts read (Chat
    Completions; ``native``: the natively served API's reader; ``single_pass``: a classification,
    usage only) and translated for the client. Raises ``zlib.error`` for a body that does not
    decode and :class:`EngineError` for one the translation cannot read (the turn fails: 502)."""
    if decoder:
        body = decoder.decompress(body) + decoder.flush()
    outcome = Finished()
    timed = False
    if decoder is False:
        pass  # encoded in a way the relay does not decode: passed with its header, facts unknown
    elif single_pass:
        prompt, completion = _usage(_json_object(body))
        outcome = Finished(prompt_tokens=prompt, completion_tokens=completion)
    else:
        timed = True
        if native is not None:
            finish_reason, tool_calls, prompt, completion, ids = native(body)
            outcome = Finished(finish_reason, tool_calls, prompt, completion, tuple(ids))
        else:
            outcome = completion_facts(_json_object(body))
    if translation is not None:
        body = translation.whole(body)
    return WholeAnswer(body, outcome, timed)


def refusal_body(
    body: bytes,
    status: int,
    decoder: Decoder | Literal[False] | None = None,
    translation: Translation | None = None,
) -> bytes:
    """An engine's refusal (429, 5xx) as the client gets it: decoded, and in the client's API's
    error shape when the turn is translated (status and ``Retry-After`` unchanged)."""
    if decoder:
        body = decoder.decompress(body) + decoder.flush()
    if translation is not None:
        body = translation.refusal(status, body)
    return body


def _json_object(body: bytes) -> dict[str, Any]:
    """``body`` as a JSON object; ``{}`` when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def completion_facts(doc: dict[str, Any]) -> Finished:
    """The facts of a whole ``chat.completion`` (OpenAI Chat Completions, the non-streamed response
    object, parsed): finish reason (``"tool_calls"`` whenever a message carries tool calls),
    usage, cached prompt tokens, tool-call ids, id and model. Unknown shapes give blanks."""
    if not doc:
        return Finished()
    finish_reason, tool_calls = "", False
    for choice in doc.get("choices") or ():
        if isinstance(choice, dict):
            finish_reason = choice.get("finish_reason") or finish_reason
            message = choice.get("message")
            if isinstance(message, dict) and message.get("tool_calls"):
                tool_calls = True
    if tool_calls:
        finish_reason = "tool_calls"
    prompt, completion = _usage(doc)
    usage = doc.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    response_id, model = doc.get("id"), doc.get("model")
    return Finished(
        str(finish_reason),
        tool_calls,
        prompt,
        completion,
        tuple(completion_tool_call_ids(doc)) if tool_calls else (),
        cached if type(cached) is int and cached >= 0 else -1,
        response_id if isinstance(response_id, str) and response_id else None,
        model if isinstance(model, str) and model else None,
    )


def _usage(doc: dict[str, Any]) -> tuple[int, int]:
    """Prompt and completion tokens from a JSON answer's top-level ``usage`` (vLLM's classify
    response has one too), ``-1`` for what is missing."""
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return -1, -1
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if type(prompt) is int else -1, completion if type(completion) is int else -1)
