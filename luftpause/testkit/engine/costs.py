"""How long a simulated request takes: prompt tokens, prefill and decode time.

The model is deliberately plain: prefill costs ``prefill_ms_per_1k`` per 1,000 prompt tokens and
each output token costs ``decode_ms``, whatever else runs. This is the one place where later
behaviour changes the cost of a request: a prefix cache would lower the prompt tokens that need
prefill, and batch-size effects would make decode slower as more requests run at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Prompt tokens, estimated as characters / 4 over :func:`message_texts`; at least 1."""
    chars = sum(len(text) for text in message_texts(messages))
    return max(1, -(-chars // CHARS_PER_TOKEN))


class CostModel:
    """Seconds of prefill and decode for one request on one engine."""

    def __init__(self, settings: EngineSettings) -> None:
        self._prefill_s_per_token = settings.prefill_ms_per_1k / 1000.0 / 1000.0
        self._decode_s = settings.decode_ms / 1000.0

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Seconds before the first output token, for ``prompt_tokens`` tokens of prompt."""
        return prompt_tokens * self._prefill_s_per_token

    def decode_seconds(self) -> float:
        """Seconds per output token (the same for every batch size, for now)."""
        return self._decode_s
