"""What the simulated model answers: a round of tool calls, or a final text answer.

The reply is a list of *pieces*, one per output token, so that streaming, the non-streamed
answer, ``max_tokens`` and usage all count the same thing:

* a text answer is ``"I saw N tool results."`` followed by filler words, as long as the request's
  token limit (or the engine's default reply length); it ends with ``finish_reason: "stop"``,
  unless the limit is too short for that first sentence, when it is cut (``"length"``);
* a tool round is one call (two when ``parallel_tool_calls`` is true and the conversation's hash
  says so): each call is a header piece (id and name) and then its JSON arguments, four
  characters per piece, ending with ``"tool_calls"``, or cut with ``"length"`` when the limit
  falls inside.

A tool round happens when tools are offered, ``tool_choice`` is not ``"none"`` and fewer than
``tool_rounds`` assistant messages with ``tool_calls`` follow the last user message; a
``"required"`` or named ``tool_choice`` always gets a call, as the OpenAI API promises.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.toolargs import ArgumentMaker, stable_int

# Characters of tool-call arguments per streamed fragment (about one token).
ARGUMENT_CHARS_PER_PIECE = 4

FILLER_WORDS: tuple[str, ...] = tuple(
    """
    the results suggest a steady pattern across each source and further review confirms this summary
    of findings with several details worth noting in context overall evidence points to clear answer
    given data available so far while some questions remain open for later work on topic which seems
    consistent
    """.split()
)

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]{2,}")


@dataclass(frozen=True, slots=True)
class ContentPiece:
    """Token ``position`` of a text answer."""

    text: str
    position: int


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The first token of tool call ``index``: its id and function name, empty arguments."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArgumentsPiece:
    """A fragment of tool call ``index``'s JSON arguments."""

    index: int
    fragment: str


Piece = ContentPiece | ToolCallStart | ToolArgumentsPiece


class Reply:
    """The reply, already cut to the token limit: ``count`` pieces and why it ends.

    Pieces are made on demand (:meth:`pieces`), so a request with a huge ``max_tokens`` costs
    nothing until its tokens are due, and nothing at all if its client leaves first.
    """

    count: int
    finish_reason: str  # "stop", "length" or "tool_calls"

    def pieces(self, start: int, stop: int) -> list[Piece]:
        """Pieces ``start`` to ``stop - 1`` (``0 <= start <= stop <= count``)."""
        raise NotImplementedError

    def top_logprobs(self, piece: ContentPiece, count: int) -> list[tuple[str, float]]:
        """(token, natural-log probability) for ``piece`` and ``count - 1`` alternatives, most
        likely first; the chosen token has probability 0.5-0.9 and the others share the rest
        geometrically, so the probabilities never sum past 1. A text answer takes its
        alternatives from the first distinct words of the last user message (so a label must be
        among its first ``N - 1`` words to be scored), then filler words; their order comes from a
        hash of the prompt, so label scoring (``max_tokens: 1``, ``top_logprobs: N``) is
        deterministic per prompt and varies between prompts."""
        raise NotImplementedError


class ToolCallReply(Reply):
    """One tool round: per call a :class:`ToolCallStart`, then its argument fragments."""

    def __init__(self, all_pieces: list[Piece], limit: int) -> None:
        self._pieces = all_pieces[:limit]
        self.count = len(self._pieces)
        self.finish_reason = "length" if len(all_pieces) > limit else "tool_calls"

    def pieces(self, start: int, stop: int) -> list[Piece]:
        return self._pieces[start:stop]

    def top_logprobs(self, piece: ContentPiece, count: int) -> list[tuple[str, float]]:
        return []


class TextReply(Reply):
    """``"I saw N tool results."`` and filler words up to the limit."""

    def __init__(self, user_text: str, results: int, limit: int, seed: int) -> None:
        noun = "result" if results == 1 else "results"
        self._opening = ("I", " saw", f" {results}", " tool", f" {noun}.")
        self._offset = stable_int(seed, user_text)
        self._seed = seed
        self._user_text = user_text
        self._alternatives = (*words_of(user_text), *FILLER_WORDS)
        self.count = limit
        self.finish_reason = "length" if limit < len(self._opening) else "stop"

    def _text(self, position: int) -> str:
        if position < len(self._opening):
            return self._opening[position]
        # A fixed stride through the vocabulary: varied text at the cost of one index per token.
        return " " + FILLER_WORDS[(self._offset + position * 7) % len(FILLER_WORDS)]

    def pieces(self, start: int, stop: int) -> list[Piece]:
        return [ContentPiece(self._text(i), i) for i in range(start, stop)]

    def top_logprobs(self, piece: ContentPiece, count: int) -> list[tuple[str, float]]:
        # Everything hashes the prompt too, so that a label scorer gets a different verdict for a
        # different input, and the same verdict for the same prompt on any replica.
        chosen_p = 0.5 + (stable_int(self._seed, self._user_text, piece.text, piece.position) % 41) / 100.0
        top = [(piece.text, math.log(chosen_p))]
        prefix = "" if piece.position == 0 else " "
        candidates: list[str] = []
        for word in self._alternatives:
            if len(candidates) >= count - 1:
                break
            candidate = prefix + word
            if candidate != piece.text and candidate not in candidates:
                candidates.append(candidate)
        # Which candidate is likelier is the prompt's hash, not the order they were taken in.
        candidates.sort(key=lambda token: stable_int(self._seed, self._user_text, piece.position, token))
        rest = 1.0 - chosen_p
        for candidate in candidates:
            rest /= 2.0
            top.append((candidate, math.log(rest)))
        return top


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Text of the last ``user`` message ("" when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
                )
            return ""
    return ""


def messages_since_user(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """The messages after the last ``user`` message (all of them when there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return messages[i + 1 :]
    return messages


def tool_rounds_done(messages: Sequence[Mapping[str, Any]]) -> int:
    """Assistant messages with ``tool_calls`` after the last user message."""
    return sum(
        1 for m in messages_since_user(messages) if m.get("role") == "assistant" and m.get("tool_calls")
    )


def tool_results_seen(messages: Sequence[Mapping[str, Any]]) -> int:
    """``tool`` messages after the last user message."""
    return sum(1 for m in messages_since_user(messages) if m.get("role") == "tool")


def words_of(text: str) -> list[str]:
    """Distinct words of three or more characters, lower-cased, in order of appearance."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text):
        seen.setdefault(word.lower(), None)
    return list(seen)


def plan_reply(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any,
    parallel_tool_calls: bool,
    limit: int,
    tool_rounds: int,
    seed: int,
) -> Reply:
    """The reply to a validated request; ``limit`` is the token limit (at least 1).

    ``tools`` are OpenAI function tools (``{"type": "function", "function": {...}}``);
    ``tool_choice`` is ``None``, ``"none"``, ``"auto"``, ``"required"`` or
    ``{"type": "function", "function": {"name": ...}}``.
    """
    user_text = last_user_text(messages)
    rounds = tool_rounds_done(messages)
    forced = tool_choice == "required" or isinstance(tool_choice, Mapping)
    if tools and tool_choice != "none" and (forced or rounds < tool_rounds):
        pieces = _tool_call_pieces(user_text, tools, tool_choice, parallel_tool_calls, rounds, seed)
        return ToolCallReply(pieces, limit)
    return TextReply(user_text, tool_results_seen(messages), limit, seed)


def _tool_call_pieces(
    user_text: str,
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any,
    parallel: bool,
    rounds: int,
    seed: int,
) -> list[Piece]:
    functions = [t["function"] for t in tools]
    if isinstance(tool_choice, Mapping):
        wanted = tool_choice["function"]["name"]
        first = next(i for i, f in enumerate(functions) if f["name"] == wanted)
        count = 1
    else:
        first = stable_int(seed, user_text, rounds, "tool") % len(functions)
        count = 1 + stable_int(seed, user_text, rounds, "parallel") % 2 if parallel else 1
    words = words_of(user_text)
    pieces: list[Piece] = []
    for index in range(count):
        function = functions[(first + index) % len(functions)]
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        maker = ArgumentMaker(schema, words, key=f"{seed}/{user_text}/{rounds}/{index}")
        arguments = json.dumps(maker.arguments())
        pieces.append(ToolCallStart(index, f"call_{secrets.token_hex(12)}", function["name"]))
        for start in range(0, len(arguments), ARGUMENT_CHARS_PER_PIECE):
            pieces.append(ToolArgumentsPiece(index, arguments[start : start + ARGUMENT_CHARS_PER_PIECE]))
    return pieces
