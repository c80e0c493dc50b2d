"""The shape of a JSON Schema in one line, for a model to read (:func:`expected_shape`), and the
few readings of a schema that it shares with the coercion of tool arguments
(:mod:`luftpause.runtime.agent.tool_arguments`, whose refusals end with the shape expected):
the types a schema declares, a local ``$ref``'s target, a value as JSON text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

from jsonpointer import EndOfList, JsonPointer, JsonPointerException

MAX_SHAPE_DEPTH: Final = 6
"""Nesting shown in an expected shape before it says ``…``."""


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


def as_mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is a mapping (a schema's ``properties``), else an empty one."""
    return value if isinstance(value, Mapping) else {}


def declared_types(schema: Mapping[str, Any]) -> list[str]:
    """The JSON types ``schema``'s ``type`` names, in order (``[]`` for none or a malformed one)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [name for name in declared if isinstance(name, str)]
    return []


def local_ref(root: Mapping[str, Any], ref: str) -> object | None:
    """The part of ``root`` a local JSON Pointer reference (RFC 6901 in a URI fragment, section 6:
    percent-decoded first) names, or None when ``ref`` is not local or names nothing. The pointer is
    resolved by ``jsonpointer`` (python-json-pointer); ``-`` (past a list's end) names nothing."""
    if not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if not pointer:
        return root
    if not pointer.startswith("/"):
        return None  # an anchor ("#name"): left to the validator
    try:
        node = JsonPointer(pointer).resolve(root)
    except JsonPointerException:
        return None
    return None if isinstance(node, EndOfList) else node


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
        target = local_ref(root, ref)
        return _shape(target, root, depth + 1) if target is not None else "any"
    if "const" in schema:
        return literal(schema["const"])
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " | ".join(literal(item) for item in enum)
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
    types = declared_types(schema)
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
    properties = as_mapping(schema.get("properties"))
    required = schema.get("required")
    needed = (
        set(required) if isinstance(required, list) and all(isinstance(r, str) for r in required) else set()
    )
    fields = [
        f"{literal(key)}{'' if key in needed else '?'}: {_shape(sub, root, depth + 1)}"
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


def literal(value: object) -> str:
    """``value`` as JSON text (``repr`` for what JSON cannot hold)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
