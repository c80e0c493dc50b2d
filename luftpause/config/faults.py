"""A configuration's faults in TOML's words (:mod:`luftpause.config`'s error form): every pydantic
error of a strict model as ``key: expected ..., got ...`` (``replicas[0].url: expected an http://
or https:// URL, got 'ftp://x'``), the file's faults after the file's name, then one per variable or
flag that set the key (``--listen: expected 'host:port', got '8080'``); and TOML data with its
arrays as tuples for the strict models."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from luftpause.config.settings import Layer, model_class, toml_value

# What pydantic's strict type errors mean in TOML's words (a tuple is a TOML array).
_EXPECTED_TYPE = {
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "tuple_type": "an array",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "literal_error": None,  # ctx["expected"] lists the allowed values
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys the table at ``loc`` (a pydantic error's location inside ``model``) may have;
    ``[]`` where ``loc`` is not a table."""
    current: Any = model
    for part in loc:
        if isinstance(part, str) and "[" in part:  # a union's branch, no key
            continue
        table = model_class(current)
        if table is not None:
            if not isinstance(part, str) or part not in table.model_fields:
                return []
            current = table.model_fields[part].annotation
        elif get_origin(current) is tuple and isinstance(part, int):
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return []
    table = model_class(current)
    return [key for key in table.model_fields if key != "source"] if table is not None else []


def _unknown_key(loc: Sequence[str | int], model: type[BaseModel] | None) -> str:
    """``unknown key``, with ``(did you mean 'listen'?)`` when a key of that table is close."""
    if model is None or not loc or not isinstance(loc[-1], str):
        return "unknown key"
    close = difflib.get_close_matches(loc[-1], keys_at(model, loc[:-1]), n=1)
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"


def _explain(item: Any, model: type[BaseModel] | None = None) -> str:
    """One pydantic error as ``expected ..., got ...`` (the form of the module docstring);
    ``model``, the validated class, names the key an unknown one may be a typo of."""
    kind: str = item["type"]
    ctx: dict[str, Any] = item.get("ctx") or {}
    got = toml_value(item["input"])
    if kind == "extra_forbidden":
        return _unknown_key(item["loc"], model)
    if kind == "missing":
        return "expected a value, none given"
    if kind == "literal_error":
        return f"expected {ctx['expected']}, got {got}"
    if kind in _EXPECTED_TYPE:
        return f"expected {_EXPECTED_TYPE[kind]}, got {got}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # 0, not 0.0 (pydantic reports a float field's bound as a float)
        return f"expected a number {_BOUNDS[kind]} {toml_value(bound)}, got {got}"
    if kind == "too_short":
        count = ctx.get("min_length", 1)
        return f"expected an array of at least {count} item{'s' if count != 1 else ''}, got {got}"
    if kind == "string_too_short":
        return f"expected a non-empty string, got {got}"
    if kind == "value_error":  # our validators already say "expected ..., got ..."
        return str(item["msg"]).removeprefix("Value error, ")
    return f"{item['msg']}, got {got}"


def _key(loc: Sequence[str | int]) -> str:
    """An error's location as the file's key: ``replicas[0].url``."""
    key = ""
    for part in loc:
        if isinstance(part, str) and "[" in part:  # a union's branch (``tuple[str, ...]``), no key
            continue
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def describe_layered(
    error: ValidationError, where: str, layer: Layer, model: type[BaseModel] | None = None
) -> str:
    """Every fault as ``key: expected ..., got ...``: the file's faults after ``where`` (the file
    or ``embedded default``), then one per variable or flag, named by it (``--listen: ...``)."""
    in_file, overridden = _faults(error, layer, model)
    file_part = [f"{where}: {'; '.join(in_file)}"] if in_file else []
    return "; ".join(file_part + overridden)


def fault_lines(
    error: ValidationError, where: str, layer: Layer, model: type[BaseModel] | None = None
) -> list[str]:
    """The faults of :func:`describe_layered`, one line each, every one of the file's after
    ``where`` (``luftpause.toml: replicas[0].url: expected ...``)."""
    in_file, overridden = _faults(error, layer, model)
    return [f"{where}: {fault}" for fault in in_file] + overridden


def _faults(
    error: ValidationError, layer: Layer, model: type[BaseModel] | None
) -> tuple[list[str], list[str]]:
    in_file, overridden = [], []
    items = error.errors()
    failed_inside = {item["loc"][0] for item in items if len(item["loc"]) > 1}
    for item in items:
        loc = item["loc"]
        # pydantic also reports a list as too short when one of its items failed: noise.
        if item["type"] == "too_short" and len(loc) == 1 and loc[0] in failed_inside:
            continue
        source = layer.source_of(loc)
        if source is not None:
            label, rest = source
            overridden.append(f"{label}: {_key(rest) + ': ' if rest else ''}{_explain(item, model)}")
        elif within := layer.sources_within(loc):  # a check of a whole table they changed a key of
            overridden.append(
                f"{_key(loc) or '(top level)'} (with {', '.join(within)}): {_explain(item, model)}"
            )
        else:
            in_file.append(f"{_key(loc) or '(top level)'}: {_explain(item, model)}")
    return in_file, overridden


def describe_fields(error: ValidationError) -> str:
    """A strict model's faults in this module's words, ``key: expected ..., got ...`` joined by
    ``; `` (for a table that comes from elsewhere than the file: the admin API's replica)."""
    return "; ".join(f"{_key(item['loc']) or '(top level)'}: {_explain(item)}" for item in error.errors())


def arrays_as_tuples(value: Any) -> Any:
    """TOML data with every array a tuple (the strict models' sequences are tuples), tables kept."""
    if isinstance(value, dict):
        return {key: arrays_as_tuples(item) for key, item in value.items()}
    if isinstance(value, list):
        return tuple(arrays_as_tuples(item) for item in value)
    return value
