"""Micro-benchmark of the SSE event scanner: the compiled twin against the pure one, same run.

Run: ``.venv/bin/pytest bench/test_bench_sse.py --benchmark-only``. One round scans one whole turn's
stream, fed in the reads the dataplane would get (1-4 KB, cut anywhere). Each group holds both twins
and the summary prints their ratio (``bench/conftest.py``). The streams:

* ``content`` -- the common case: role chunk, 300 content deltas of about 100 bytes, finish chunk,
  usage chunk, ``[DONE]``, serialized as vLLM and SGLang do (UTF-8 as is).
* ``escaped content`` -- the same with non-ASCII text written as ``\\uXXXX`` escapes, which
  defeats the compiled twin's skip of inert payloads: every payload goes through orjson.
* ``tool call`` -- one tool call whose arguments arrive in 300 deltas: every payload has
  ``tool_calls`` and is parsed by both twins.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from luftpause.dataplane import _sse_py

_WORDS = (
    "the scheduler holds a turn until a replica frees a slot while the prefix cache keeps the run "
    "warm and the tool round returns results to the agent loop quickly"
).split()
_NON_ASCII_WORDS = ["Zürich", "Straße", "naïve", "日本語", "über", "café", "東京", "Grüße"]


def _base() -> dict[str, Any]:
    return {
        "id": "chatcmpl-4f1c9a7e2b",
        "object": "chat.completion.chunk",
        "created": 1730000000,
        "model": "qwen3-32b",
        "system_fingerprint": "fp_4a1d2e",
    }


def _text(rng: random.Random, words: list[str], size: int = 100) -> str:
    out = ""
    while len(out.encode()) < size:
        out += " " + rng.choice(words)
    return out


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        **_base(),
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def _stream(kind: str, deltas: int = 300) -> bytes:
    """A whole turn's event stream, as an engine sends it."""
    rng = random.Random(7)
    if kind == "tool call":
        start = {"index": 0, "id": "call_9f2k", "type": "function", "function": {"name": "write_file"}}
        objects = [_chunk({"role": "assistant", "content": None}), _chunk({"tool_calls": [start]})]
        objects += [
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": _text(rng, _WORDS, 60)}}]})
            for _ in range(deltas)
        ]
        objects.append(_chunk({}, "tool_calls"))
    else:
        words = _WORDS + _NON_ASCII_WORDS if kind == "escaped content" else _WORDS
        objects = [_chunk({"role": "assistant", "content": ""})]
        objects += [_chunk({"content": _text(rng, words)}) for _ in range(deltas)]
        objects.append(_chunk({}, "stop"))
    usage = {"prompt_tokens": 1834, "completion_tokens": 2400, "total_tokens": 4234}
    objects.append({**_base(), "choices": [], "usage": usage})

    def dump(obj: dict[str, Any]) -> bytes:
        if kind == "escaped content":
            return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
        return orjson.dumps(obj)

    return b"".join(b"data: " + dump(obj) + b"\n\n" for obj in objects) + b"data: [DONE]\n\n"


def _reads(stream: bytes) -> list[bytes]:
    """Cut ``stream`` into reads of 1-4 KB, as a socket would deliver it."""
    rng = random.Random(11)
    reads, offset = [], 0
    while offset < len(stream):
        size = rng.randint(1024, 4096)
        reads.append(stream[offset : offset + size])
        offset += size
    return reads


def _scanner_class(twin: str) -> Any:
    if twin == "py":
        return _sse_py.SSEScanner
    try:
        return importlib.import_module("luftpause.dataplane._sse_c").SSEScanner
    except ImportError:
        pytest.skip("the compiled twin is not built (pip install -e . --no-deps --no-build-isolation)")


@pytest.mark.parametrize("twin", ["py", "c"])
@pytest.mark.parametrize("kind", ["content", "escaped content", "tool call"])
def test_scan_one_turn(
    benchmark: Any, record_twin_time: Callable[[str, str], None], kind: str, twin: str
) -> None:
    scanner_class = _scanner_class(twin)
    reads = _reads(_stream(kind))
    group = f"sse scanner: {kind} stream"
    benchmark.group = group

    def scan_turn() -> Any:
        scanner = scanner_class()
        for read in reads:
            scanner.feed(read)
        return scanner

    scanner = benchmark(scan_turn)
    record_twin_time(group, twin)
    # what was measured must be a correct scan
    assert scanner.first_token_seen and scanner.done
    assert scanner.event_count == (305 if kind == "tool call" else 304)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (1834, 2400)
    assert scanner.finish_reason == ("tool_calls" if kind == "tool call" else "stop")
    assert scanner.error is None


# --- natively served Messages and Responses answers -------------------------------------------------


def _native_stream(api: str, kind: str) -> bytes:
    """The chat stream ``kind`` as a replica serving ``api`` natively sends it: written here by
    luftpause's own translators (the formats of the Anthropic and OpenAI references; their tests
    check them against the official clients), so both streams carry the same answer."""
    from luftpause.dataplane.apis.messages_stream import MessagesStream
    from luftpause.dataplane.apis.responses_stream import ResponsesStream

    translator: Any = (
        MessagesStream("qwen3-32b", "msg_bench")
        if api == "messages"
        else ResponsesStream("resp_bench", "qwen3-32b", 1730000000)
    )
    chat = _stream(kind)
    return translator.feed(chat) + translator.finish()  # type: ignore[no-any-return]


def _native_class(api: str, twin: str) -> Any:
    name = "MessagesScanner" if api == "messages" else "ResponsesScanner"
    if twin == "py":
        return getattr(importlib.import_module("luftpause.dataplane.apis._facts_py"), name)
    try:
        return getattr(importlib.import_module("luftpause.dataplane.apis._facts_c"), name)
    except ImportError:
        pytest.skip("the compiled twin is not built (pip install -e . --no-deps --no-build-isolation)")


@pytest.mark.parametrize("twin", ["py", "c"])
@pytest.mark.parametrize("kind", ["content", "tool call"])
@pytest.mark.parametrize("api", ["messages", "responses"])
def test_scan_one_native_turn(
    benchmark: Any, record_twin_time: Callable[[str, str], None], api: str, kind: str, twin: str
) -> None:
    """The fact scanner of a natively served answer (relayed unchanged), in its API's events."""
    scanner_class = _native_class(api, twin)
    reads = _reads(_native_stream(api, kind))
    group = f"{api} fact scanner: {kind} stream"
    benchmark.group = group

    def scan_turn() -> Any:
        scanner = scanner_class()
        for read in reads:
            scanner.feed(read)
        return scanner

    scanner = benchmark(scan_turn)
    record_twin_time(group, twin)
    assert scanner.first_token_seen and scanner.done and scanner.error is None
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (1834, 2400)
    assert scanner.finish_reason == ("tool_calls" if kind == "tool call" else "stop")
