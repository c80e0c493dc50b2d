"""Tool-call sanity, the arguments half (issue 5): coercion toward the input schema, validation,
refusals that show the expected shape.

The tables hold the bad inputs the issue names; Hypothesis checks the contract for any JSON value
against random simple schemas: nothing but ToolArgumentsError escapes, what comes back validates,
and arguments that already validate come back untouched.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from luftpause.runtime.agent.schema_shape import local_ref
from luftpause.runtime.agent.tool_arguments import (
    MAX_NESTING,
    ToolArgumentsError,
    expected_shape,
    prepare_arguments,
)

SEARCH: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "score": {"type": "number"},
        "exact": {"type": "boolean"},
        "cursor": {"type": "null"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "filter": {"type": "object", "properties": {"year": {"type": "integer"}}},
    },
    "required": ["query"],
    "additionalProperties": False,
}


def one(field: str, value: Any) -> dict[str, Any]:
    return {"query": "q", field: value}


# -- coercion: (name, schema, raw arguments, expected result) -----------------------------------

COERCED: list[tuple[str, dict[str, Any], Any, dict[str, Any]]] = [
    # A neighbour that needs coercion, so the walk runs (valid arguments are returned as given).
    (
        "string-typed field with '3' left alone",
        SEARCH,
        {"query": "3", "limit": "3"},
        {"query": "3", "limit": 3},
    ),
    (
        "string-typed 'true', 'null', '[1]' left alone",
        {
            "type": "object",
            "properties": {"s": {"type": "array", "items": {"type": "string"}}, "n": {"type": "integer"}},
        },
        {"s": ["true", "null", "[1]"], "n": "1"},
        {"s": ["true", "null", "[1]"], "n": 1},
    ),
    ("'3' to integer", SEARCH, one("limit", "3"), one("limit", 3)),
    ("'-3' to integer", SEARCH, one("limit", "-3"), one("limit", -3)),
    ("'3.0' to integer (JSON Schema counts 3.0 as an integer)", SEARCH, one("limit", "3.0"), one("limit", 3)),
    ("' 3 ' to integer, whitespace ignored", SEARCH, one("limit", " 3 "), one("limit", 3)),
    ("'2.5' to number", SEARCH, one("score", "2.5"), one("score", 2.5)),
    ("'3' to number", SEARCH, one("score", "3"), one("score", 3)),
    ("'-1e3' to number", SEARCH, one("score", "-1e3"), one("score", -1000.0)),
    ("'true' to boolean", SEARCH, one("exact", "true"), one("exact", True)),
    ("'False' to boolean, any letter case", SEARCH, one("exact", "False"), one("exact", False)),
    ("'null' to null", SEARCH, one("cursor", "null"), one("cursor", None)),
    ("JSON text to array, items coerced too", SEARCH, one("tags", '[1, "2"]'), one("tags", [1, 2])),
    (
        "JSON text to object, properties coerced too",
        SEARCH,
        one("filter", '{"year": "2024"}'),
        one("filter", {"year": 2024}),
    ),
    ("array items coerced", SEARCH, one("tags", ["1", "2"]), one("tags", [1, 2])),
    ("nested object coerced", SEARCH, one("filter", {"year": "1999"}), one("filter", {"year": 1999})),
    (
        "arguments as JSON text, coerced",
        SEARCH,
        '{"query": "q", "limit": "5"}',
        {"query": "q", "limit": 5},
    ),
    (
        "arguments double-encoded as JSON text of JSON text",
        SEARCH,
        json.dumps('{"query": "q"}'),
        {"query": "q"},
    ),
    ("None is {}", {"type": "object"}, None, {}),
    ("empty string is {}", {"type": "object", "properties": {"a": {"type": "integer"}}}, "", {}),
    ("whitespace is {}", {"type": "object"}, "  \n", {}),
    (
        "type list: '3' to integer when string is not allowed",
        {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
        {"n": "3"},
        {"n": 3},
    ),
    (
        "type list: 'null' to null",
        {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
        {"n": "null"},
        {"n": None},
    ),
    (
        "type list with string: left alone",
        {"type": "object", "properties": {"n": {"type": ["integer", "string"]}, "m": {"type": "integer"}}},
        {"n": "3", "m": "3"},
        {"n": "3", "m": 3},
    ),
    (
        "type list tried in order: number before boolean",
        {"type": "object", "properties": {"n": {"type": ["boolean", "number"]}}},
        {"n": "1.5"},
        {"n": 1.5},
    ),
    (
        "anyOf: first alternative that the coerced value fits",
        {"type": "object", "properties": {"n": {"anyOf": [{"type": "boolean"}, {"type": "integer"}]}}},
        {"n": "7"},
        {"n": 7},
    ),
    (
        "anyOf with a string alternative: a valid string is left alone",
        {
            "type": "object",
            "properties": {
                "n": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "m": {"type": "integer"},
            },
        },
        {"n": "7", "m": "7"},
        {"n": "7", "m": 7},
    ),
    (
        "anyOf: a string alternative that rejects it does not stop coercion",
        {
            "type": "object",
            "properties": {"n": {"anyOf": [{"type": "string", "maxLength": 0}, {"type": "integer"}]}},
        },
        {"n": "7"},
        {"n": 7},
    ),
    (
        "oneOf: integer or null",
        {"type": "object", "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "null"}]}}},
        {"n": "null"},
        {"n": None},
    ),
    (
        "oneOf: array of integers given as JSON text",
        {
            "type": "object",
            "properties": {
                "n": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]}
            },
        },
        {"n": '["1", 2]'},
        {"n": [1, 2]},
    ),
    (
        "$ref to $defs followed",
        {
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/point"}},
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        },
        {"p": '{"x": "1.5"}'},
        {"p": {"x": 1.5}},
    ),
    (
        "recursive $ref, nested three deep",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                }
            },
            "$ref": "#/$defs/node",
        },
        {"v": "1", "kids": [{"v": "2", "kids": [{"v": "3"}]}]},
        {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]},
    ),
    (
        "draft-07 definitions and tuple items",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "pair": {"type": "array", "items": [{"type": "string"}, {"$ref": "#/definitions/n"}]}
            },
            "definitions": {"n": {"type": "integer"}},
        },
        {"pair": ["1", "2"]},
        {"pair": ["1", 2]},
    ),
    (
        "2020-12 prefixItems then items",
        {
            "type": "object",
            "properties": {
                "row": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}}
            },
        },
        {"row": ["true", "true", "false"]},
        {"row": ["true", True, False]},
    ),
    (
        "additionalProperties schema coerces unnamed keys",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"a": "1", "b": "2"},
        {"a": 1, "b": 2},
    ),
    (
        "patternProperties coerce matching keys",
        {"type": "object", "patternProperties": {"^n_": {"type": "number"}}},
        {"n_a": "0.5", "s": "0.5"},
        {"n_a": 0.5, "s": "0.5"},
    ),
    (
        "a remote $ref is not fetched; the call goes on as given",
        {"type": "object", "properties": {"a": {"$ref": "https://example.invalid/schema.json"}}},
        {"a": "x"},
        {"a": "x"},
    ),
    (
        "a schema that is not JSON Schema cannot judge: arguments go on as given",
        {"type": "object", "properties": {"a": {"type": "integr"}}},
        {"a": "3"},
        {"a": "3"},
    ),
]


@pytest.mark.parametrize(("schema", "raw", "expected"), [c[1:] for c in COERCED], ids=[c[0] for c in COERCED])
def test_coercion(schema: dict[str, Any], raw: Any, expected: dict[str, Any]) -> None:
    result = prepare_arguments(raw, schema)
    assert result == expected
    # bool is an int in Python: compare the JSON types as well as the values.
    assert json.dumps(result, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_the_given_object_is_never_mutated() -> None:
    raw = {"query": "q", "tags": ["1"], "filter": {"year": "2"}}
    before = json.loads(json.dumps(raw))
    assert prepare_arguments(raw, SEARCH) == {"query": "q", "tags": [1], "filter": {"year": 2}}
    assert raw == before


# -- refusals: (name, schema, raw arguments, text in the message, path) --------------------------

REFUSED: list[tuple[str, dict[str, Any], Any, str, str]] = [
    (
        "'abc' to integer refused",
        SEARCH,
        one("limit", "abc"),
        "'abc' is not of type 'integer'",
        "arguments.limit",
    ),
    (
        "'3.5' is not an integer",
        SEARCH,
        one("limit", "3.5"),
        "'3.5' is not of type 'integer'",
        "arguments.limit",
    ),
    (
        "'1e3' is not written as an integer",
        SEARCH,
        one("limit", "1e3"),
        "is not of type 'integer'",
        "arguments.limit",
    ),
    (
        "'yes' is not a boolean",
        SEARCH,
        one("exact", "yes"),
        "'yes' is not of type 'boolean'",
        "arguments.exact",
    ),
    ("'None' is not null", SEARCH, one("cursor", "None"), "'None' is not of type 'null'", "arguments.cursor"),
    (
        "'1e999' is not a finite number",
        SEARCH,
        one("score", "1e999"),
        "is not of type 'number'",
        "arguments.score",
    ),
    (
        "JSON text of an object is not an array",
        SEARCH,
        one("tags", '{"a": 1}'),
        "is not of type 'array'",
        "arguments.tags",
    ),
    (
        "a bad item inside JSON text",
        SEARCH,
        one("tags", '[1, "x"]'),
        "is not of type 'integer'",
        "arguments.tags[1]",
    ),
    (
        "a bad field nested",
        SEARCH,
        one("filter", {"year": "soon"}),
        "'soon' is not of type 'integer'",
        "arguments.filter.year",
    ),
    ("missing required", SEARCH, {"limit": 3}, "'query' is a required property", "arguments"),
    ("missing required in an empty string", SEARCH, "", "'query' is a required property", "arguments"),
    ("missing required in None", SEARCH, None, "'query' is a required property", "arguments"),
    (
        "extra property with additionalProperties false",
        SEARCH,
        {"query": "q", "extra": 1},
        "Additional properties are not allowed ('extra' was unexpected)",
        "arguments",
    ),
    ("JSON text of an array", SEARCH, "[1, 2]", "arguments must be a JSON object, got an array", "arguments"),
    ("JSON text of a number", SEARCH, "3", "arguments must be a JSON object, got a number", "arguments"),
    (
        "JSON text of a string",
        SEARCH,
        '"query"',
        "arguments must be a JSON object, got a string",
        "arguments",
    ),
    ("JSON text of null", SEARCH, "null", "arguments must be a JSON object, got null", "arguments"),
    ("malformed JSON text", SEARCH, '{"query": "q",', "arguments are not valid JSON", "arguments"),
    ("a list object", SEARCH, [1], "arguments must be a JSON object, got list", "arguments"),
    (
        "anyOf that nothing fits",
        {"type": "object", "properties": {"n": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
        {"n": "x"},
        "'x' is not valid under any of the given schemas",
        "arguments.n",
    ),
    (
        "oneOf that two alternatives fit",
        {"type": "object", "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
        {"n": "1"},
        "is valid under each of",
        "arguments.n",
    ),
    (
        "enum is not coerced into",
        {"type": "object", "properties": {"mode": {"type": "string", "enum": ["fast", "exact"]}}},
        {"mode": "FAST"},
        "'FAST' is not one of ['fast', 'exact']",
        "arguments.mode",
    ),
    (
        "a key that is not an identifier is quoted in the path",
        {"type": "object", "properties": {"a b": {"type": "integer"}}},
        {"a b": "no"},
        "is not of type 'integer'",
        'arguments["a b"]',
    ),
    (
        "an array index is in the path",
        {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}},
        {"xs": [1, "two"]},
        "'two' is not of type 'integer'",
        "arguments.xs[1]",
    ),
]


@pytest.mark.parametrize(
    ("schema", "raw", "problem", "path"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refusal(schema: dict[str, Any], raw: Any, problem: str, path: str) -> None:
    with pytest.raises(ToolArgumentsError) as caught:
        prepare_arguments(raw, schema)
    error = caught.value
    assert problem in error.problem
    assert error.path == path
    assert error.expected == expected_shape(schema)
    assert str(error) == f"{error.problem} at {path}; expected {error.expected}"


def test_the_refusal_shows_the_expected_shape() -> None:
    schema = {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    }
    with pytest.raises(ToolArgumentsError) as caught:
        prepare_arguments('{"query": "x", "limit": "abc"}', schema)
    assert str(caught.value) == (
        "'abc' is not of type 'integer' at arguments.limit; expected {\"query\": string, \"limit\"?: integer}"
    )


def test_a_refusal_quotes_a_long_value_short_and_keeps_what_is_wrong() -> None:
    with pytest.raises(ToolArgumentsError) as caught:
        prepare_arguments(one("limit", "x" * 100_000), SEARCH)
    assert caught.value.problem == "'" + "x" * 78 + "… is not of type 'integer'"


def test_a_refusal_stays_short_whatever_the_message() -> None:
    with pytest.raises(ToolArgumentsError) as caught:
        prepare_arguments({"query": "q", "k" * 100_000: 1}, SEARCH)
    assert caught.value.problem.startswith("Additional properties are not allowed")
    assert len(caught.value.problem) == 300
    assert caught.value.problem.endswith("…")


def test_arguments_nested_too_deeply_are_refused() -> None:
    deep: Any = 1
    for _ in range(MAX_NESTING + 1):
        deep = [deep]
    with pytest.raises(ToolArgumentsError, match="nest deeper"):
        prepare_arguments({"a": deep}, {"type": "object"})


def test_json_text_nested_past_the_parser_is_refused() -> None:
    with pytest.raises(ToolArgumentsError, match="not valid JSON"):
        prepare_arguments("[" * 100_000 + "]" * 100_000, {"type": "object"})


def test_deep_json_text_for_an_array_field_is_refused_not_crashed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array"}}}
    with pytest.raises(ToolArgumentsError, match="is not of type 'array'"):
        prepare_arguments({"a": "[" * 100_000 + "]" * 100_000}, schema)


def test_a_huge_integer_text_is_refused_not_crashed() -> None:
    with pytest.raises(ToolArgumentsError, match="is not of type 'integer'"):
        prepare_arguments(one("limit", "9" * 10_000), SEARCH)


def test_format_is_not_checked() -> None:
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}
    assert prepare_arguments({"when": "tomorrow"}, schema) == {"when": "tomorrow"}


def test_the_draft_the_schema_declares_is_used() -> None:
    # Draft 4 reads exclusiveMaximum as a boolean modifier; 2020-12 would reject the schema as
    # invalid and pass the call through unchecked.
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 5, "exclusiveMaximum": True}},
    }
    assert prepare_arguments({"n": "4"}, schema) == {"n": 4}
    with pytest.raises(ToolArgumentsError, match="greater than or equal to the maximum of 5"):
        prepare_arguments({"n": "5"}, schema)


def test_an_unknown_schema_dialect_falls_back_to_2020_12() -> None:
    schema = {"$schema": "https://example.invalid/dialect", "type": "object", "required": ["a"]}
    with pytest.raises(ToolArgumentsError, match="'a' is a required property"):
        prepare_arguments({}, schema)


# -- expected shapes --------------------------------------------------------------------------

SHAPES: list[tuple[Any, str]] = [
    (
        SEARCH,
        '{"query": string, "limit"?: integer, "score"?: number, "exact"?: boolean, "cursor"?: null, '
        '"tags"?: integer[], "filter"?: {"year"?: integer}}',
    ),
    ({"type": "object"}, "object"),
    ({}, "any"),
    ({"type": ["integer", "null"]}, "integer | null"),
    ({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "(integer | null)[]"),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}]}, "[string, number]"),
    ({"enum": ["a", 1, None]}, '"a" | 1 | null'),
    ({"const": "x"}, '"x"'),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, "{string: integer}"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "boolean"}}}, "boolean"),
    ({"$ref": "#"}, "…"),
    ("not a schema", "any"),
]


@pytest.mark.parametrize(("schema", "shape"), SHAPES)
def test_expected_shape(schema: Any, shape: str) -> None:
    assert expected_shape(schema) == shape


# -- the contract, for any JSON value -----------------------------------------------------------

SCALAR_TYPES = ["integer", "number", "boolean", "null", "string"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
scalar_texts = st.sampled_from(["3", "3.0", "-2.5", "true", "False", "null", "[1]", '{"a": 1}', "abc", ""])


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    scalar = st.one_of(
        st.sampled_from(SCALAR_TYPES).map(lambda name: {"type": name}),
        st.lists(st.sampled_from(SCALAR_TYPES), min_size=1, max_size=3, unique=True).map(
            lambda names: {"type": names}
        ),
    )

    def extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        return st.one_of(
            children.map(lambda item: {"type": "array", "items": item}),
            st.dictionaries(st.sampled_from(["a", "b", "c"]), children, max_size=3).flatmap(
                lambda props: st.fixed_dictionaries(
                    {"type": st.just("object"), "properties": st.just(props)},
                    optional={
                        "required": st.lists(
                            st.sampled_from(sorted(props) or ["a"]), unique=True, max_size=2
                        ),
                        "additionalProperties": st.booleans(),
                    },
                )
            ),
            st.lists(children, min_size=1, max_size=3).map(lambda alts: {"anyOf": alts}),
            st.lists(children, min_size=1, max_size=3).map(lambda alts: {"oneOf": alts}),
        )

    return st.recursive(scalar, extend, max_leaves=8)


root_schemas = _schemas().map(
    lambda schema: (
        schema if schema.get("type") == "object" else {"type": "object", "properties": {"a": schema}}
    )
)
arguments = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(["a", "b", "c"]), json_values | scalar_texts, max_size=3),
    json_values.map(json.dumps),
    st.text(max_size=20),
)


@settings(max_examples=400, deadline=None)
@given(raw=arguments, schema=root_schemas)
def test_only_tool_arguments_error_escapes_and_results_validate(raw: Any, schema: dict[str, Any]) -> None:
    try:
        result = prepare_arguments(raw, schema)
    except ToolArgumentsError as error:
        assert str(error)
        return
    assert isinstance(result, dict)
    assert Draft202012Validator(schema).is_valid(result)


@settings(max_examples=300, deadline=None)
@given(raw=st.dictionaries(st.sampled_from(["a", "b", "c"]), json_values, max_size=3), schema=root_schemas)
def test_valid_arguments_come_back_untouched(raw: dict[str, Any], schema: dict[str, Any]) -> None:
    if Draft202012Validator(schema).is_valid(raw):
        assert prepare_arguments(raw, schema) is raw
        assert prepare_arguments(json.dumps(raw), schema) == raw


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=12) | scalar_texts, schema=root_schemas)
def test_string_typed_fields_are_never_touched(text: str, schema: dict[str, Any]) -> None:
    wrapped = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "t": {"type": ["null", "string"]},
            "n": {"type": "integer"},
            "x": schema,
        },
    }
    # "n" needs coercion, so the walk runs over the string fields too.
    result = prepare_arguments({"s": text, "t": text, "n": "1"}, wrapped)
    assert result["n"] == 1
    assert result["s"] == text
    assert result["t"] == text


def test_a_schema_changed_after_use_is_checked_as_it_now_is() -> None:
    def schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    mutable = schema()
    assert prepare_arguments({"n": "3"}, mutable) == {"n": 3}
    mutable["properties"]["n"]["type"] = "string"
    assert prepare_arguments({"n": "3"}, mutable) == {"n": "3"}
    # The validator kept for the first shape is not tied to the object that was changed.
    assert prepare_arguments({"n": "3"}, schema()) == {"n": 3}
    with pytest.raises(ToolArgumentsError, match="is not of type 'integer'"):
        prepare_arguments({"n": "x"}, schema())


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_as_invalid_json(constant: str) -> None:
    """``json.loads`` accepts them by default; they are not JSON and reached the tool as floats."""
    with pytest.raises(ToolArgumentsError, match=f"{constant.lstrip('-')}.* is not a JSON number"):
        prepare_arguments('{"query": "q", "limit": ' + constant + "}", SEARCH)
    with pytest.raises(ToolArgumentsError, match="not a JSON number"):
        prepare_arguments(json.dumps('{"query": "q", "weight": ' + constant + "}"), SEARCH)


def test_all_of_shows_every_part_not_any() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]}
    assert expected_shape(schema) == '{"a"?: integer}'  # the bare "required" part shows nothing
    both = {"allOf": [{"type": "integer"}, {"type": "number"}]}
    assert expected_shape(both) == "integer & number"


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("#", "root"),
        ("#/$defs/a~1b", {"type": "string"}),  # "~1" is "/"
        ("#/$defs/x~0y", {"type": "integer"}),  # "~0" is "~"
        ("#/$defs/a%7E1b", {"type": "string"}),  # a URI fragment is percent-decoded first
        ("#/$defs/list/0", {"type": "null"}),
        ("#/$defs/list/5", None),
        ("#/$defs/list/-", None),  # past the list's end: names nothing
        ("#/$defs/list/x", None),
        ("#/$defs/nope", None),
        ("#/$defs/scalar/x", None),
        ("#anchor", None),  # an anchor: the validator's
        ("other.json#/a", None),  # not local
    ],
)
def test_a_local_ref_is_resolved_as_rfc_6901_says(ref: str, expected: object) -> None:
    root = {
        "$defs": {
            "a/b": {"type": "string"},
            "x~y": {"type": "integer"},
            "list": [{"type": "null"}],
            "scalar": 3,
        }
    }
    assert local_ref(root, ref) == (root if expected == "root" else expected)
