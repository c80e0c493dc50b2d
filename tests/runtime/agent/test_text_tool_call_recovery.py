"""Tool-call sanity, the recovery half (issue 5): a call written as text is recovered only when it
names an offered tool and is the whole reply. Each written form positive, then the negatives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.runtime.agent.text_tool_calls import RecoveredCall, openai_tool_call, recover_tool_call
from luftpause.runtime.agent.tool_arguments import prepare_arguments

OFFERED = ["search", "read_file"]
ARGS = {"query": "weather in Oslo", "limit": 3}
ARGS_JSON = json.dumps(ARGS)

# (name, reply text, recovered name, recovered arguments)
RECOVERED: list[tuple[str, str, str, dict[str, Any] | str]] = [
    ("llama 3 python_tag", f'<|python_tag|>{{"name": "search", "parameters": {ARGS_JSON}}}', "search", ARGS),
    (
        "llama 3 python_tag ending in eom_id",
        f'<|python_tag|>{{"name": "search", "parameters": {ARGS_JSON}}}<|eom_id|>',
        "search",
        ARGS,
    ),
    (
        "llama 3 python_tag ending in eot_id",
        f'<|python_tag|>{{"name": "search", "parameters": {ARGS_JSON}}}<|eot_id|>',
        "search",
        ARGS,
    ),
    ("llama 3 python_tag without parameters", '<|python_tag|>{"name": "read_file"}', "read_file", {}),
    ("llama 3 bare JSON with parameters", f'{{"name": "search", "parameters": {ARGS_JSON}}}', "search", ARGS),
    (
        "llama 3.2 type function",
        f'{{"type": "function", "name": "search", "parameters": {ARGS_JSON}}}',
        "search",
        ARGS,
    ),
    (
        "hermes / qwen2.5 tool_call block",
        f'<tool_call>\n{{"name": "search", "arguments": {ARGS_JSON}}}\n</tool_call>',
        "search",
        ARGS,
    ),
    (
        "hermes with arguments before name",
        f'<tool_call>{{"arguments": {ARGS_JSON}, "name": "search"}}</tool_call>',
        "search",
        ARGS,
    ),
    (
        "hermes without the closing tag (stopped at the end of turn)",
        f'<tool_call>\n{{"name": "search", "arguments": {ARGS_JSON}}}',
        "search",
        ARGS,
    ),
    ("hermes without arguments", '<tool_call>{"name": "read_file"}</tool_call>', "read_file", {}),
    (
        "hermes whose arguments quote the tags",
        '<tool_call>{"name": "search", "arguments": {"query": "</tool_call><tool_call>"}}</tool_call>',
        "search",
        {"query": "</tool_call><tool_call>"},
    ),
    ("bare JSON with arguments", f'{{"name": "search", "arguments": {ARGS_JSON}}}', "search", ARGS),
    (
        "bare JSON with arguments as JSON text",
        json.dumps({"name": "search", "arguments": ARGS_JSON}),
        "search",
        ARGS_JSON,
    ),
    (
        "surrounding whitespace",
        f'\n\n  {{"name": "search", "arguments": {ARGS_JSON}}}  \n',
        "search",
        ARGS,
    ),
    (
        "in a json code fence",
        f'```json\n{{"name": "search", "arguments": {ARGS_JSON}}}\n```',
        "search",
        ARGS,
    ),
    (
        "hermes in a bare code fence",
        f'```\n<tool_call>\n{{"name": "search", "arguments": {ARGS_JSON}}}\n</tool_call>\n```',
        "search",
        ARGS,
    ),
    (
        "pretty-printed JSON",
        json.dumps({"name": "search", "arguments": ARGS}, indent=2),
        "search",
        ARGS,
    ),
]


@pytest.mark.parametrize(
    ("text", "name", "arguments"), [c[1:] for c in RECOVERED], ids=[c[0] for c in RECOVERED]
)
def test_recovered(text: str, name: str, arguments: dict[str, Any] | str) -> None:
    assert recover_tool_call(text, OFFERED) == RecoveredCall(name, arguments)


# (name, reply text)
NOT_RECOVERED: list[tuple[str, str]] = [
    ("text before the call", f'Let me search. {{"name": "search", "arguments": {ARGS_JSON}}}'),
    ("text after the call", f'{{"name": "search", "arguments": {ARGS_JSON}}}\nThat should do it.'),
    (
        "text before a hermes block",
        f'I will call it.\n<tool_call>{{"name": "search", "arguments": {ARGS_JSON}}}</tool_call>',
    ),
    (
        "text after a hermes block",
        f'<tool_call>{{"name": "search", "arguments": {ARGS_JSON}}}</tool_call>\nDone.',
    ),
    ("text after a python_tag call", f'<|python_tag|>{{"name": "search", "parameters": {ARGS_JSON}}} ok'),
    ("a tool not offered", f'{{"name": "delete_everything", "arguments": {ARGS_JSON}}}'),
    ("a tool not offered, hermes", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'),
    ("name differs in case", f'{{"name": "Search", "arguments": {ARGS_JSON}}}'),
    ("malformed JSON", '{"name": "search", "arguments": {"query": "x"'),
    ("malformed JSON in hermes", '<tool_call>{"name": "search", "arguments": {query: 1}}</tool_call>'),
    ("single quotes are not JSON", "{'name': 'search', 'arguments': {}}"),
    ("trailing comma", '{"name": "search", "arguments": {},}'),
    (
        "two hermes blocks",
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {}}</tool_call>',
    ),
    (
        "two llama calls separated by a semicolon",
        '{"name": "search", "parameters": {}}; {"name": "read_file", "parameters": {}}',
    ),
    ("two bare objects", '{"name": "search", "arguments": {}}\n{"name": "search", "arguments": {}}'),
    ("a JSON array of calls", '[{"name": "search", "arguments": {}}]'),
    (
        "hermes tag around python_tag (two forms mixed)",
        '<tool_call><|python_tag|>{"name": "search", "parameters": {}}</tool_call>',
    ),
    (
        "python_tag around a hermes block (two forms mixed)",
        '<|python_tag|><tool_call>{"name": "search", "arguments": {}}</tool_call>',
    ),
    (
        "a hermes block followed by bare JSON (two forms mixed)",
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>{"name": "search", "arguments": {}}',
    ),
    ("a closing tag without an opening one", '{"name": "search", "arguments": {}}</tool_call>'),
    ("both arguments and parameters", '{"name": "search", "arguments": {}, "parameters": {}}'),
    ("bare JSON without arguments", '{"name": "search"}'),
    ("an extra key", '{"name": "search", "arguments": {}, "reason": "because"}'),
    ("a type other than function", '{"type": "tool", "name": "search", "arguments": {}}'),
    ("arguments that are a list", '{"name": "search", "arguments": [1, 2]}'),
    ("arguments that are null", '{"name": "search", "arguments": null}'),
    ("a name that is not a string", '{"name": 3, "arguments": {}}'),
    ("an empty name", '{"name": "", "arguments": {}}'),
    (
        "OpenAI's nested function object",
        '{"type": "function", "function": {"name": "search", "arguments": "{}"}}',
    ),
    ("an answer that is JSON data", '{"city": "Oslo", "temperature": 3}'),
    ("plain prose", "The weather in Oslo is 3 degrees."),
    ("empty reply", ""),
    ("an unclosed code fence", f'```json\n{{"name": "search", "arguments": {ARGS_JSON}}}'),
    ("text outside the code fence", f'Here:\n```json\n{{"name": "search", "arguments": {ARGS_JSON}}}\n```'),
    ("deeply nested JSON", '{"name": "search", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}"),
]


@pytest.mark.parametrize("text", [c[1] for c in NOT_RECOVERED], ids=[c[0] for c in NOT_RECOVERED])
def test_not_recovered(text: str) -> None:
    assert recover_tool_call(text, OFFERED) is None


def test_nothing_is_recovered_when_no_tools_are_offered() -> None:
    assert recover_tool_call('{"name": "search", "arguments": {}}', []) is None


def test_offered_may_be_any_iterable_of_names() -> None:
    call = recover_tool_call('{"name": "search", "arguments": {}}', (name for name in OFFERED))
    assert call == RecoveredCall("search", {})


def test_a_recovered_call_becomes_an_openai_tool_call_and_its_arguments_are_prepared() -> None:
    call = recover_tool_call(
        f'<tool_call>{{"name": "search", "arguments": {ARGS_JSON}}}</tool_call>', OFFERED
    )
    assert call is not None
    entry = openai_tool_call(call, "call_text_1")
    assert entry == {
        "id": "call_text_1",
        "type": "function",
        "function": {"name": "search", "arguments": ARGS_JSON},
    }
    schema = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}
    assert prepare_arguments(entry["function"]["arguments"], schema) == ARGS


def test_arguments_given_as_json_text_stay_text_in_the_openai_call() -> None:
    call = RecoveredCall("search", '{"limit": "3"}')
    assert openai_tool_call(call, "c")["function"]["arguments"] == '{"limit": "3"}'


@settings(max_examples=300, deadline=None)
@given(text=st.text() | st.sampled_from([c[1] for c in RECOVERED + NOT_RECOVERED]).map(lambda t: t[:-1]))
def test_never_raises_and_recovers_only_offered_names(text: str) -> None:
    call = recover_tool_call(text, OFFERED)
    assert call is None or call.name in OFFERED


@pytest.mark.parametrize("text", [c[1] for c in RECOVERED], ids=[c[0] for c in RECOVERED])
@pytest.mark.parametrize("around", ["Sure: {}", "{} Done.", "ok\n{}", "{}\n\nok"])
def test_any_recovered_form_with_words_around_it_is_not_recovered(text: str, around: str) -> None:
    assert recover_tool_call(around.format(text), OFFERED) is None


# Found by the review (issue 5): each was not recovered, or was recovered with a non-JSON number.
REVIEW_RECOVERED: list[tuple[str, str]] = [
    (
        "llama JSON ended by eot_id, no python_tag",
        '{"name": "search", "parameters": ' + json.dumps(ARGS) + "}<|eot_id|>",
    ),
    ("leading byte order mark", "\ufeff" + json.dumps({"name": "search", "arguments": ARGS})),
]


@pytest.mark.parametrize("text", [c[1] for c in REVIEW_RECOVERED], ids=[c[0] for c in REVIEW_RECOVERED])
def test_review_cases_are_recovered(text: str) -> None:
    assert recover_tool_call(text, OFFERED) == RecoveredCall("search", ARGS)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_call_with_nan_or_infinity_is_not_recovered(constant: str) -> None:
    assert recover_tool_call('{"name": "search", "arguments": {"limit": ' + constant + "}}", OFFERED) is None
