"""Arguments for a simulated tool call that are valid against the tool's JSON Schema.

The schema is a function tool's ``parameters`` (OpenAI chat completions, "function calling"),
which follows JSON Schema (draft 2020-12 in practice; MCP tools publish the same shape, often with
``$defs``/``$ref`` from pydantic). What is handled:

* ``const``, then ``default``, then ``enum`` win over the type;
* ``string`` (a short word from the user's message, fitted to ``minLength``/``maxLength``; a few
  ``format`` values), ``integer`` and ``number`` (inside ``minimum``/``maximum`` and their
  exclusive forms, a ``multipleOf`` when given), ``boolean``, ``null``, ``array`` (``items``,
  ``minItems``/``maxItems``, ``prefixItems``), ``object`` (every ``required`` property, some of
  the optional ones, nested to any depth);
* ``type`` as a list (the first non-null type), ``anyOf``/``oneOf`` (the first branch),
  ``allOf`` (branches merged), local ``$ref`` into ``$defs``/``definitions``.

``pattern`` is not honoured: a word that matches an arbitrary regular expression cannot be made
in general.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

# Below this depth optional properties and array items are left out, so that recursive schemas
# (a tree node whose children are tree nodes) end.
_MAX_DEPTH = 4

_FALLBACK_WORDS = ("example", "status", "summary", "report", "overview")


def stable_int(*parts: object) -> int:
    """A 64-bit integer from ``parts`` that is the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ArgumentMaker:
    """Makes one call's arguments for one schema, choosing words and values deterministically.

    ``words`` are candidate strings (from the user's message); ``key`` varies the choices between
    calls (round, call index, seed).
    """

    def __init__(self, root_schema: Mapping[str, Any], words: Sequence[str], key: str) -> None:
        self._root = root_schema
        self._words = tuple(words) or _FALLBACK_WORDS
        self._key = key

    def arguments(self) -> dict[str, Any]:
        """The arguments object; a schema that is not an object schema still yields an object."""
        value = self._value(self._root, "$", 0)
        return value if isinstance(value, dict) else {}

    def _pick(self, path: str, count: int) -> int:
        return stable_int(self._key, path) % count

    def _resolve(self, schema: Mapping[str, Any], depth: int = 0) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or depth > 16:
            return schema
        if not ref.startswith("#/"):
            return {k: v for k, v in schema.items() if k != "$ref"}
        target: Any = self._root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                return {k: v for k, v in schema.items() if k != "$ref"}
            target = target[part]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return self._resolve(merged, depth + 1)

    def _value(self, schema: Any, path: str, depth: int) -> Any:
        if not isinstance(schema, Mapping):
            return self._word(path)  # ``true`` or a malformed schema: anything goes; a word is valid
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if "default" in schema:
            return schema["default"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[self._pick(path, len(enum))]
        for combinator in ("anyOf", "oneOf"):
            branches = schema.get(combinator)
            if isinstance(branches, list) and branches:
                rest = {k: v for k, v in schema.items() if k != combinator}
                non_null = [b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")]
                first = (non_null or branches)[0]
                return self._value({**rest, **self._resolve(first)}, path, depth)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged = _merge_all_of(schema, [self._resolve(b) for b in all_of if isinstance(b, Mapping)])
            return self._value(merged, path, depth)
        kind = _schema_type(schema)
        if kind == "object":
            return self._object(schema, path, depth)
        if kind == "array":
            return self._array(schema, path, depth)
        if kind == "integer":
            return self._integer(schema, path)
        if kind == "number":
            return self._number(schema, path)
        if kind == "boolean":
            return self._pick(path, 2) == 1
        if kind == "null":
            return None
        return self._string(schema, path)

    def _object(self, schema: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = [r for r in schema.get("required") or () if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name in required:
            out[name] = self._value(properties.get(name, {}), f"{path}.{name}", depth + 1)
        if depth < _MAX_DEPTH:
            for name, sub in properties.items():
                if name not in out and self._pick(f"{path}.{name}?", 2) == 0:
                    out[name] = self._value(sub, f"{path}.{name}", depth + 1)
        min_props = schema.get("minProperties")
        if isinstance(min_props, int):
            for name, sub in properties.items():
                if len(out) >= min_props:
                    break
                out.setdefault(name, self._value(sub, f"{path}.{name}", depth + 1))
            filler = 0
            while len(out) < min_props and schema.get("additionalProperties", True) is not False:
                extra = schema.get("additionalProperties")
                out[f"extra{filler}"] = self._value(
                    extra if isinstance(extra, Mapping) else {}, path, depth + 1
                )
                filler += 1
        return out

    def _array(self, schema: Mapping[str, Any], path: str, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", {})
        min_items = schema.get("minItems", 0) if isinstance(schema.get("minItems"), int) else 0
        max_items = schema.get("maxItems") if isinstance(schema.get("maxItems"), int) else None
        wanted = max(min_items, len(prefix), 0 if depth >= _MAX_DEPTH else 1)
        if max_items is not None:
            wanted = min(wanted, max_items)
        if items is False:
            wanted = min(wanted, len(prefix))
        out: list[Any] = []
        for i in range(wanted):
            sub = prefix[i] if i < len(prefix) else items
            out.append(self._value(sub, f"{path}[{i}]", depth + 1))
        if schema.get("uniqueItems") is True:
            distinct: list[Any] = []
            for value in out:
                if value not in distinct:
                    distinct.append(value)
            out = distinct
        return out

    def _integer(self, schema: Mapping[str, Any], path: str) -> int:
        low, high = _bounds(schema)
        lo: int | None = None
        hi: int | None = None
        if low is not None:
            lo = math.floor(low[0]) + 1 if low[1] else math.ceil(low[0])
        if high is not None:
            hi = math.ceil(high[0]) - 1 if high[1] else math.floor(high[0])
        if lo is None:
            lo = 1 if hi is None or hi >= 1 else hi
        if hi is None:
            hi = lo + 4
        multiple = schema.get("multipleOf")
        if isinstance(multiple, int) and not isinstance(multiple, bool) and multiple > 0:
            first = -(-lo // multiple) * multiple
            return first if first <= hi else lo
        if hi < lo:
            return lo
        return lo + self._pick(path, hi - lo + 1)

    def _number(self, schema: Mapping[str, Any], path: str) -> float:
        low, high = _bounds(schema)
        lo = low[0] if low else (high[0] - 4.0 if high else 0.0)
        hi = high[0] if high else lo + 4.0
        multiple = schema.get("multipleOf")
        if isinstance(multiple, (int, float)) and multiple > 0:
            value = math.ceil(lo / multiple) * multiple
            if low and low[1] and value <= lo:
                value += multiple
            return float(value)
        # A point strictly inside (lo, hi) satisfies exclusive and inclusive bounds alike.
        fraction = (1 + self._pick(path, 9)) / 10.0
        return lo + (hi - lo) * fraction if hi > lo else lo

    def _string(self, schema: Mapping[str, Any], path: str) -> str:
        fmt = schema.get("format")
        if fmt == "date-time":
            return "2026-01-01T00:00:00Z"
        if fmt == "date":
            return "2026-01-01"
        if fmt in ("uri", "url"):
            return f"https://example.com/{self._word(path)}"
        if fmt == "email":
            return f"{self._word(path)}@example.com"
        if fmt == "uuid":
            return "00000000-0000-4000-8000-000000000000"
        word = self._word(path)
        min_len: int = schema["minLength"] if isinstance(schema.get("minLength"), int) else 0
        max_len: int | None = schema["maxLength"] if isinstance(schema.get("maxLength"), int) else None
        while len(word) < min_len:
            word = f"{word} {self._word(path + '+' + str(len(word)))}"
        if max_len is not None:
            word = word[:max_len]
            word = word if len(word) >= min_len else "x" * min_len
        return word

    def _word(self, path: str) -> str:
        return self._words[self._pick(path, len(self._words))]


def _schema_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        kind = non_null[0] if non_null else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _bounds(schema: Mapping[str, Any]) -> tuple[tuple[float, bool] | None, tuple[float, bool] | None]:
    """((lower, exclusive), (upper, exclusive)) from the draft-2020 and draft-4 keywords."""
    low: tuple[float, bool] | None = None
    high: tuple[float, bool] | None = None
    if isinstance(schema.get("minimum"), (int, float)):
        low = (schema["minimum"], schema.get("exclusiveMinimum") is True)
    if isinstance(schema.get("exclusiveMinimum"), (int, float)) and not isinstance(
        schema.get("exclusiveMinimum"), bool
    ):
        low = (schema["exclusiveMinimum"], True)
    if isinstance(schema.get("maximum"), (int, float)):
        high = (schema["maximum"], schema.get("exclusiveMaximum") is True)
    if isinstance(schema.get("exclusiveMaximum"), (int, float)) and not isinstance(
        schema.get("exclusiveMaximum"), bool
    ):
        high = (schema["exclusiveMaximum"], True)
    return low, high


def _merge_all_of(schema: Mapping[str, Any], branches: list[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for branch in branches:
        for key, value in branch.items():
            if key == "properties" and isinstance(value, Mapping):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged
