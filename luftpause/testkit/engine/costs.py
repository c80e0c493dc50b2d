"""How long a simulated request takes: prompt tokens, prefill and decode time.

* Tokens are estimated from text length: 4 characters per token (the usual rule of thumb for
  English text with BPE tokenizers), rounded up per message, so a prompt's tokens are the sum of
  its messages' and a prefix of messages has a token count of its own (see :mod:`.prefix_cache`).
* Prefill costs ``prefill_ms_per_1k`` per 1,000 prompt tokens that are *not* in the prefix cache.
* Each output token costs ``decode_ms * (1 + batch_slowdown * (running - 1))``: one decode step of
  a batch of ``running`` requests takes longer the bigger the batch, as on a GPU (each step reads
  every running request's KV cache).
* Every duration is multiplied by ``time_scale``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Not at run time: settings imports the engine model, whose prefix paths import this module.
    from luftpause.testkit.engine.settings import EngineSettings

# Characters per token: the usual rule of thumb for English text with BPE tokenizers.
CHARS_PER_TOKEN = 4


def message_texts(messages: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    """Every text a prompt carries: message contents (plain or text parts) and tool-call arguments."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    yield part["text"]
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                yield function["arguments"]


def message_tokens(message: Mapping[str, Any]) -> int:
    """Tokens of one message: its characters (:func:`message_texts`) / 4, rounded up."""
    chars = sum(len(text) for text in message_texts((message,)))
    return -(-chars // CHARS_PER_TOKEN)


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Prompt tokens: the sum of :func:`message_tokens`; at least 1."""
    return max(1, sum(message_tokens(message) for message in messages))


class CostModel:
    """Seconds (already multiplied by ``time_scale``) of prefill and decode on one engine."""

    def __init__(self, settings: EngineSettings) -> None:
        scale = settings.time_scale
        self._prefill_s_per_token = settings.prefill_ms_per_1k / 1000.0 / 1000.0 * scale
        self._decode_s = settings.decode_ms / 1000.0 * scale
        self._slowdown = settings.batch_slowdown

    def prefill_seconds(self, uncached_tokens: int) -> float:
        """Seconds before the first output token, for ``uncached_tokens`` prompt tokens that the
        prefix cache did not hold."""
        return uncached_tokens * self._prefill_s_per_token

    def decode_seconds(self, running: int) -> float:
        """Seconds per output token while ``running`` requests (at least 1) decode together."""
        return self._decode_s * (1.0 + self._slowdown * (max(running, 1) - 1))
