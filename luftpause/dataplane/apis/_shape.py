"""Small checks shared by the request translators: each raises :class:`TranslationError` naming
the field at fault as a path (``messages[2].content[0]``), so a client learns what to change."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from luftpause.dataplane.apis.errors import TranslationError


def obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TranslationError(f"'{path}' must be an object", path)
    return value


def array(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise TranslationError(f"'{path}' must be an array", path)
    return value


def string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise TranslationError(f"'{path}' must be a string", path)
    return value


def number(value: Any, path: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TranslationError(f"'{path}' must be a number", path)
    return value


def integer(value: Any, path: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TranslationError(f"'{path}' must be an integer of at least {minimum}", path)
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise TranslationError(f"'{path}' must be true or false", path)
    return value


def known_keys(value: Mapping[str, Any], allowed: Iterable[str], path: str, what: str) -> None:
    """Refuse the first key of ``value`` not in ``allowed``: silently dropping a field could change
    what the client gets without its knowing."""
    allowed = set(allowed)
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            raise TranslationError(
                f"'{where}' is not supported by luftpause's {what} translation (to Chat Completions); "
                "remove it, or serve this model from a replica that speaks this API natively",
                where,
            )


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (tool arguments in Chat Completions are a JSON string)."""
    return orjson.dumps(value).decode()


def no_tool_choice_without_tools(body: dict[str, Any]) -> None:
    """Without tools (none given, or only dropped ones), a tool choice means nothing and vLLM
    refuses one ("When using `tool_choice`, `tools` must be set"): drop it, and
    ``parallel_tool_calls``, from the Chat Completions ``body``."""
    if "tools" not in body:
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)
