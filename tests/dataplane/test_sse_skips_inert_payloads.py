"""Both SSE twins skip parsing inert payloads after the first token, by the same algorithm.

The compiled twin's 3x over the pure one in ``bench/test_bench_sse.py`` was once met partly by an
algorithm only it had (``_is_inert``: a content delta after the first token is not handed to
orjson). The pure twin has it too now, so the benchmark compares compilation alone. Here the pure
twin's ``orjson`` is swapped for a counting one: after the first token, content deltas are not
parsed, while finish reason, usage, tool calls, errors and anything with a ``\\u`` escape are.
(``tests/dataplane/test_sse_scanner.py`` holds both twins to identical results on every case and on
random streams.)
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from luftpause.dataplane import _sse_py


def _event(payload: dict[str, Any] | bytes) -> bytes:
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return b"data: " + data + b"\n\n"


def _chunk(delta: dict[str, Any], finish_reason: str | None = None, **more: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        **more,
    }


class _CountingOrjson:
    """Stands in for the ``orjson`` module inside ``_sse_py``: records every payload parsed."""

    JSONDecodeError = orjson.JSONDecodeError

    def __init__(self) -> None:
        self.parsed: list[bytes] = []

    def loads(self, data: bytes) -> Any:
        self.parsed.append(bytes(data))
        return orjson.loads(data)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> _CountingOrjson:
    counter = _CountingOrjson()
    monkeypatch.setattr(_sse_py, "orjson", counter)
    return counter


def test_content_deltas_after_the_first_token_are_not_parsed(counting: _CountingOrjson) -> None:
    role = orjson.dumps(_chunk({"role": "assistant", "content": ""}))
    first = orjson.dumps(_chunk({"content": "Hello"}))
    later = [orjson.dumps(_chunk({"content": f" word {i}"})) for i in range(5)]
    finish = orjson.dumps(_chunk({}, "stop"))
    usage = orjson.dumps({**_chunk({}), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}})
    scanner = _sse_py.SSEScanner()
    scanner.feed(b"".join(_event(p) for p in [role, first, *later, finish, usage]) + b"data: [DONE]\n\n")
    assert counting.parsed == [role, first, finish, usage]
    assert scanner.first_token_seen and scanner.done
    assert scanner.finish_reason == "stop"
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (3, 7)


@pytest.mark.parametrize(
    "payload",
    [
        orjson.dumps(_chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f"}}]})),
        orjson.dumps(_chunk({}, "length")),
        orjson.dumps({"error": {"message": "boom"}}),
        orjson.dumps({"object": "error", "message": "boom"}),
        b'{"choices": [], "usage" : {"prompt_tokens": 1}}',
        b'{"choices": [{"delta": {"content": "\\u00fc"}, "finish_reason": null}]}',  # \u: parsed
        b'{"choices": [{"finish_reason" \t:\t"stop"}]}',
    ],
)
def test_payloads_that_may_matter_are_parsed_after_the_first_token(
    counting: _CountingOrjson, payload: bytes
) -> None:
    scanner = _sse_py.SSEScanner()
    scanner.feed(_event(_chunk({"content": "Hello"})))
    assert scanner.first_token_seen
    scanner.feed(_event(payload))
    assert counting.parsed[-1] == payload


def test_null_valued_keys_leave_a_payload_inert(counting: _CountingOrjson) -> None:
    scanner = _sse_py.SSEScanner()
    scanner.feed(_event(_chunk({"content": "Hello"})))
    inert = b'{"object": "chat.completion.chunk", "choices": [{"delta": {"content": "x", "tool_calls": null},'
    inert += b' "finish_reason" : null}], "usage": null, "error":null}'
    scanner.feed(_event(inert))
    assert counting.parsed[-1] != inert
