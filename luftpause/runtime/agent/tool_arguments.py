"""A tool call's arguments made fit for its tool: coerced toward the input schema, then validated.

Models often get the JSON types of tool arguments wrong in harmless ways (``"limit": "3"``,
``"tags": "[\\"a\\"]"``), and a call sent on like that fails at the MCP server or, worse, does the
wrong thing. :func:`prepare_arguments` repairs only what the tool's ``inputSchema`` (MCP spec,
``tools/list``; a JSON Schema) makes unambiguous, validates the result with a real JSON Schema
validator, and refuses the rest with :class:`ToolArgumentsError`, whose text tells the model what
was wrong, where, and the shape expected, so it can try again.

The rules::

    arguments      an object, or its JSON text; None, "" or whitespace -> {} (then validated:
                   a schema with required properties refuses it). JSON text of a string that
                   itself holds a JSON object (double-encoded) is opened once. Anything else that
                   is not an object is refused.
    already valid  arguments that validate as given are returned unchanged, untouched.
    coercion       only a *string* value, only where the schema declares a type and "string" is
                   not among the declared types (a string-typed field is never touched), trying
                   the declared types in order:
                     integer   "3", "-3", "3.0", "3.00" -> 3     (JSON Schema counts 3.0 as an
                               integer); "3.5", "1e3", "03", "three" stay as they are
                     number    JSON number text: "2.5" -> 2.5, "3" -> 3, "-1e3" -> -1000.0;
                               non-finite results ("1e999") stay as they are
                     boolean   "true" / "false", any letter case ("True" is what Python writes)
                     null      "null", any letter case ("None" is not JSON and stays)
                     array     JSON text of an array  -> list
                     object    JSON text of an object -> dict
                   Surrounding whitespace is ignored. Coercion goes down ``properties``,
                   ``patternProperties``, ``additionalProperties``, ``items`` / ``prefixItems`` /
                   ``additionalItems``, follows local ``$ref`` (``#``, ``#/$defs/...``,
                   ``#/definitions/...``), and for ``anyOf`` / ``oneOf`` leaves a value alone when
                   it already validates against an alternative, else takes the first alternative
                   (in order) that the coerced value validates against. ``allOf``, ``not``,
                   ``if``/``then``/``else`` and the dependent keywords are not looked into.
                   Recursion is bounded (:data:`MAX_SCHEMA_DEPTH` schema steps).
    validation     ``jsonschema`` with the draft the schema names in ``$schema`` (default 2020-12),
                   format checking off (as the spec's default: ``format`` is an annotation), and
                   no remote ``$ref`` retrieval (an empty ``referencing`` registry).
    unusable schema  a schema that is not valid JSON Schema, or whose ``$ref`` cannot be resolved
                   locally, cannot say what is wrong with a call: the arguments (an object) go
                   to the tool as given, and its server is the judge. The model cannot repair a
                   server's schema, so refusing every call would only burn its tool budget.

Nothing but :class:`ToolArgumentsError` escapes :func:`prepare_arguments`, for any arguments a
model's reply can hold (JSON text, or the objects it decodes to).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

__all__ = [
    "MAX_NESTING",
    "MAX_SCHEMA_DEPTH",
    "ToolArgumentsError",
    "expected_shape",
    "prepare_arguments",
]

MAX_SCHEMA_DEPTH: Final = 64
"""Schema steps (a property, an item, a followed ``$ref``, an alternative) coercion takes from the
root before it leaves a value as it is; bounds recursive schemas (``{"$ref": "#"}``)."""

MAX_NESTING: Final = 64
"""Deepest nesting of arrays and objects accepted in arguments; deeper ones are refused before
validation, whose recursion grows with it."""

MAX_PROBLEM_CHARS: Final = 300
MAX_EXPECTED_CHARS: Final = 800
"""Bounds on the two parts of a refusal, in characters: the validator quotes the offending value
and a tool's schema can be large, and the refusal goes back into the model's context."""

CHECKER_CACHE_SIZE: Final = 256
"""Distinct tool schemas whose validators are kept (least recently used go first)."""

MAX_QUOTED_CHARS: Final = 80
"""Longest quotation of the offending value in a refusal, in characters."""

MAX_SHAPE_DEPTH: Final = 6
"""Nesting shown in an expected shape before it says ``…``."""


class ToolArgumentsError(ValueError):
    """Arguments that are not, and could not be made, what the tool's input schema asks for.

    ``str(err)`` is the text for the model, e.g.
    ``'abc' is not of type 'integer' at arguments.limit; expected {"query": string, "limit"?: integer}``.
    Attributes: ``problem`` (what was wrong), ``path`` (where: ``arguments``, ``arguments.items[0]``)
    and ``expected`` (the schema's shape, see :func:`expected_shape`).
    """

    def __init__(self, problem: str, path: str, expected: str) -> None:
        self.problem = _clip(problem, MAX_PROBLEM_CHARS)
        self.path = path
        self.expected = expected
        super().__init__(f"{self.problem} at {path}; expected {expected}")


def prepare_arguments(raw: object, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of one tool call, coerced toward ``schema`` and validated against it.

    ``raw`` is the call's ``function.arguments`` as the model gave it: normally JSON text (OpenAI
    chat completions), sometimes already an object, or None / ``""`` for a call without arguments.
    ``schema`` is the tool's MCP ``inputSchema``. Returns a new dict (``raw`` is never mutated), or
    ``raw`` itself when it was a valid object already. The rules are in the module docstring.

    Raises :class:`ToolArgumentsError` (and nothing else) when the arguments are not a JSON
    object, nest deeper than :data:`MAX_NESTING`, or still fail validation after coercion.
    """
    checker = _checker_of(schema)

    def refuse(problem: str, path: str = "arguments") -> ToolArgumentsError:
        # The shape is rendered only for a refusal: most calls are valid as given.
        expected = "a JSON object" if checker is None else _clip(expected_shape(schema), MAX_EXPECTED_CHARS)
        return ToolArgumentsError(problem, path, expected)

    try:
        arguments = _as_object(raw)
    except _NotAnObject as exc:
        raise refuse(str(exc)) from None
    if _nesting(arguments) > MAX_NESTING:
        raise refuse(f"arguments nest deeper than {MAX_NESTING} levels")
    if checker is None:
        return arguments
    try:
        if checker.is_valid(arguments, checker.root):
            return arguments
        coerced = checker.coerce(arguments, checker.root, 0)
        error = best_match(checker.validator.iter_errors(coerced))
    except (referencing.exceptions.Unresolvable, SchemaError):
        # The schema points somewhere it does not define (or is broken in a way check_schema
        # let through): it cannot judge the call, so the server does (module docstring).
        return arguments
    except RecursionError:
        raise refuse("arguments nest too deeply to check") from None
    if error is None:
        assert isinstance(coerced, dict)  # the arguments were an object, coercion keeps the kind
        return coerced
    raise refuse(_problem(error), _render_path(error.absolute_path))


def expected_shape(schema: object) -> str:
    """A compact, one-line rendering of a JSON Schema for a model to read, e.g.
    ``{"query": string, "limit"?: integer, "tags"?: string[], "mode"?: "fast" | "exact"}``.

    Objects list their properties (``?`` marks the optional ones; ``{string: T}`` is a map whose
    values are T), arrays read ``T[]`` (tuples ``[A, B]``), alternatives ``A | B``, enums and consts
    as JSON, an unconstrained value ``any``. Local ``$ref`` is followed; nesting past
    :data:`MAX_SHAPE_DEPTH` shows as ``…``. Never raises for any input.
    """
    root = schema if isinstance(schema, Mapping) else {}
    try:
        return _shape(schema, root, 0)
    except RecursionError:  # a schema of pathological width times depth; the shape is a courtesy
        return "…"


# -- arguments as an object --------------------------------------------------------------------


class _NotAnObject(ValueError):
    """The arguments are not a JSON object; the message says what they are instead."""


def _refuse_constant(name: str) -> Any:
    """``json.loads`` takes ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON (RFC 8259
    section 6) and which no tool can mean: refused as invalid JSON."""
    raise ValueError(f"{name} is not a JSON number")


def _as_object(raw: object) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str | bytes | bytearray):
        raise _NotAnObject(f"arguments must be a JSON object, got {type(raw).__name__}")
    try:
        text = raw.decode() if isinstance(raw, bytes | bytearray) else raw
        if not text.strip():
            return {}
        value = json.loads(text, parse_constant=_refuse_constant)
        if isinstance(value, str) and value.lstrip().startswith("{"):
            # double-encoded: JSON text of the JSON text of an object
            value = json.loads(value, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _NotAnObject(f"arguments are not valid JSON: {_one_line(exc)}") from None
    if not isinstance(value, dict):
        raise _NotAnObject(f"arguments must be a JSON object, got {_json_kind(value)}")
    return value


def _nesting(value: object) -> int:
    """Deepest nesting of dicts and lists in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterator[object] = iter(item.values())
        elif isinstance(item, list):
            children = iter(item)
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_NESTING:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


# -- the validator and the coercion walk -------------------------------------------------------


def _validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    declared = schema.get("$schema")
    if declared is not None and not isinstance(declared, str):
        return Draft202012Validator
    # With a default given, an unknown $schema falls back to it without jsonschema's warning.
    return validator_for(schema, default=Draft202012Validator)


def _checker_of(schema: object) -> _Checker | None:
    """The checker of ``schema``, shared by every call with an equal schema: a tool's schema is
    the same on each call, and checking it against its metaschema costs milliseconds."""
    try:
        key = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # not JSON: checked afresh, not cached
        return _Checker.for_schema(schema)
    return _cached_checker(key)


@functools.lru_cache(maxsize=CHECKER_CACHE_SIZE)
def _cached_checker(key: str) -> _Checker | None:
    # Built from the key, a private deep copy: a caller that later changes its schema object
    # cannot change what a cached checker validates against.
    try:
        schema = json.loads(key)
    except RecursionError:
        return None
    return _Checker.for_schema(schema)


class _Checker:
    """One schema's validator, and the coercion walk that consults it."""

    def __init__(self, validator: Validator, root: dict[str, Any]) -> None:
        self.validator = validator
        self.root = root

    @classmethod
    def for_schema(cls, schema: object) -> _Checker | None:
        """The checker of ``schema``, or None when it is not usable JSON Schema (an object)."""
        if not isinstance(schema, Mapping):
            return None
        schema = dict(schema)
        try:
            validator_class = _validator_class(schema)
            validator_class.check_schema(schema)
            # An empty registry: ``$ref`` resolves inside the schema only. jsonschema's default
            # would fetch remote URLs (with a DeprecationWarning) in the middle of a tool round.
            validator = validator_class(schema, registry=referencing.Registry())
        except (SchemaError, ValueError, TypeError, RecursionError, referencing.exceptions.Unresolvable):
            return None
        return cls(validator, schema)

    def is_valid(self, value: Any, schema: object) -> bool:
        """Whether ``value`` validates against ``schema``, a part of the root schema (local
        ``$ref`` inside it resolve against the root)."""
        return bool(self.validator.evolve(schema=schema).is_valid(value))

    def coerce(self, value: Any, schema: object, depth: int) -> Any:
        """``value`` with its strings converted where ``schema`` declares a non-string type (see
        the module docstring); a new value, ``value`` itself is never mutated."""
        if depth > MAX_SCHEMA_DEPTH or not isinstance(schema, Mapping):
            return value
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = _local_ref(self.root, ref)
            if target is not None:
                value = self.coerce(value, target, depth + 1)
        for keyword in ("anyOf", "oneOf"):
            alternatives = schema.get(keyword)
            if isinstance(alternatives, list) and alternatives:
                value = self._coerce_alternatives(value, alternatives, depth + 1)
        if isinstance(value, str):
            value = _from_text(value, _declared_types(schema))
        if isinstance(value, dict):
            return self._coerce_object(value, schema, depth + 1)
        if isinstance(value, list):
            return self._coerce_array(value, schema, depth + 1)
        return value

    def _coerce_alternatives(self, value: Any, alternatives: list[Any], depth: int) -> Any:
        if any(self.is_valid(value, alternative) for alternative in alternatives):
            return value
        for alternative in alternatives:
            coerced = self.coerce(value, alternative, depth)
            if coerced is not value and self.is_valid(coerced, alternative):
                return coerced
        return value

    def _coerce_object(self, value: dict[str, Any], schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = _mapping(schema.get("properties"))
        patterns = _mapping(schema.get("patternProperties"))
        additional = schema.get("additionalProperties")
        coerced: dict[str, Any] = {}
        for key, item in value.items():
            matched = False
            if key in properties:
                item = self.coerce(item, properties[key], depth)
                matched = True
            for pattern, subschema in patterns.items():
                if _search(pattern, key):
                    item = self.coerce(item, subschema, depth)
                    matched = True
            if not matched:
                item = self.coerce(item, additional, depth)
            coerced[key] = item
        return coerced

    def _coerce_array(self, value: list[Any], schema: Mapping[str, Any], depth: int) -> list[Any]:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # drafts 4 to 2019-09: positional items, then additionalItems
            prefix, rest = items, schema.get("additionalItems")
        else:
            rest = items
        positional = prefix if isinstance(prefix, list) else []
        return [
            self.coerce(item, positional[index] if index < len(positional) else rest, depth)
            for index, item in enumerate(value)
        ]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _search(pattern: object, key: str) -> bool:
    if not isinstance(pattern, str):
        return False
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False


def _declared_types(schema: Mapping[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [name for name in declared if isinstance(name, str)]
    return []


def _local_ref(root: Mapping[str, Any], ref: str) -> object | None:
    """The part of ``root`` a local JSON Pointer reference (RFC 6901 in a URI fragment) names, or
    None when ``ref`` is not local or names nothing."""
    if not ref.startswith("#"):
        return None
    node: object = root
    pointer = unquote(ref[1:])
    if not pointer:
        return root
    if not pointer.startswith("/"):
        return None  # an anchor ("#name"): left to the validator
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


# -- text to scalars ---------------------------------------------------------------------------

_NOT_CONVERTED: Final = object()
_INTEGER_TEXT: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.0+)?")
_NUMBER_TEXT: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _integer(text: str) -> object:
    stripped = text.strip()
    if not _INTEGER_TEXT.fullmatch(stripped):
        return _NOT_CONVERTED
    try:
        return int(stripped.split(".", 1)[0])
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return _NOT_CONVERTED


def _number(text: str) -> object:
    stripped = text.strip()
    if not _NUMBER_TEXT.fullmatch(stripped):
        return _NOT_CONVERTED
    try:
        if not any(mark in stripped for mark in ".eE"):
            return int(stripped)
        number = float(stripped)
    except ValueError:
        return _NOT_CONVERTED
    return number if math.isfinite(number) else _NOT_CONVERTED


def _boolean(text: str) -> object:
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return _NOT_CONVERTED


def _null(text: str) -> object:
    return None if text.strip().lower() == "null" else _NOT_CONVERTED


def _json_of(kind: type[Any]) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return _NOT_CONVERTED
        return value if isinstance(value, kind) else _NOT_CONVERTED

    return convert


_FROM_TEXT: Final[Mapping[str, Callable[[str], object]]] = {
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
    "array": _json_of(list),
    "object": _json_of(dict),
}


def _from_text(text: str, types: list[str]) -> object:
    """``text`` as the first declared type that reads it, or ``text`` itself when a string is
    allowed, no type is declared, or none reads it."""
    if not types or "string" in types:
        return text
    for name in types:
        convert = _FROM_TEXT.get(name)
        if convert is not None:
            value = convert(text)
            if value is not _NOT_CONVERTED:
                return value
    return text


# -- rendering ---------------------------------------------------------------------------------

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _render_path(path: Iterable[object]) -> str:
    rendered = "arguments"
    for part in path:
        if isinstance(part, int):
            rendered += f"[{part}]"
        elif isinstance(part, str) and _IDENTIFIER.fullmatch(part):
            rendered += f".{part}"
        else:
            rendered += f"[{_literal(part)}]"
    return rendered


def _shape(schema: object, root: Mapping[str, Any], depth: int) -> str:
    if schema is True or schema == {}:
        return "any"
    if schema is False:
        return "nothing"
    if not isinstance(schema, Mapping):
        return "any"
    if depth > MAX_SHAPE_DEPTH:
        return "…"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _local_ref(root, ref)
        return _shape(target, root, depth + 1) if target is not None else "any"
    if "const" in schema:
        return _literal(schema["const"])
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " | ".join(_literal(item) for item in enum)
    for keyword in ("anyOf", "oneOf"):
        alternatives = schema.get(keyword)
        if isinstance(alternatives, list) and alternatives:
            return " | ".join(_grouped(_shape(item, root, depth + 1)) for item in alternatives)
    every = schema.get("allOf")
    if isinstance(every, list) and every:
        # Every part must hold: shown as the parts joined by "&" (the schema's own keys too).
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        parts = [_shape(item, root, depth + 1) for item in ([rest] if rest else []) + every]
        shown = [p for p in parts if p != "any"]
        return " & ".join(_grouped(p) for p in shown) if shown else "any"
    types = _declared_types(schema)
    if not types:
        if "properties" in schema or "additionalProperties" in schema:
            types = ["object"]
        elif "items" in schema or "prefixItems" in schema:
            types = ["array"]
        else:
            return "any"
    return " | ".join(_typed_shape(name, schema, root, depth) for name in types)


def _typed_shape(name: str, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
    if name == "object":
        return _object_shape(schema, root, depth)
    if name == "array":
        return _array_shape(schema, root, depth)
    return name


def _object_shape(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
    properties = _mapping(schema.get("properties"))
    required = schema.get("required")
    needed = (
        set(required) if isinstance(required, list) and all(isinstance(r, str) for r in required) else set()
    )
    fields = [
        f"{_literal(key)}{'' if key in needed else '?'}: {_shape(sub, root, depth + 1)}"
        for key, sub in properties.items()
    ]
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping) or (additional is True and not properties):
        fields.append(f"string: {_shape(additional, root, depth + 1)}")
    if not fields:
        return "object"
    return "{" + ", ".join(fields) + "}"


def _array_shape(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
    items = schema.get("items")
    prefix = schema.get("prefixItems")
    if isinstance(items, list):
        prefix = items
    if isinstance(prefix, list) and prefix:
        return "[" + ", ".join(_shape(item, root, depth + 1) for item in prefix) + "]"
    if items is None:
        return "array"
    return _grouped(_shape(items, root, depth + 1)) + "[]"


def _grouped(shape: str) -> str:
    """``shape`` in parentheses when it is a union, so ``(integer | null)[]`` reads right."""
    depth = 0
    for char in shape:
        if char in "{[(":
            depth += 1
        elif char in "}])":
            depth -= 1
        elif char == "|" and depth == 0:
            return f"({shape})"
    return shape


def _literal(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    return type(value).__name__


def _problem(error: ValidationError) -> str:
    """The validator's message with the offending value it quotes first cut short, so the words
    after it (``is not of type 'integer'``) survive the bound on the whole text."""
    message = error.message
    quoted = repr(error.instance)
    if len(quoted) > MAX_QUOTED_CHARS and message.startswith(quoted):
        message = _clip(quoted, MAX_QUOTED_CHARS) + message[len(quoted) :]
    return message


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
