"""Every key of the typed configuration as an environment variable, a help line and, for a few, a flag.

The naming rule (docs/operating.md, "Configuration"): key ``listen`` of table ``[dataplane]`` is the variable
``LUFTPAUSE_DATAPLANE__LISTEN``: :data:`ENV_PREFIX`, the table, :data:`ENV_DELIMITER` (two
underscores), the key, in capitals (lower case is read too); a whole table may also be given as a
JSON object in ``LUFTPAUSE_DATAPLANE`` (its per-key variables win over it). A flag is the key with
dashes (``--listen``, ``--state-dir``); each process offers a few
(:data:`luftpause.config.arguments.SETTING_FLAGS`).
Precedence: flag > environment variable > file > default.

A variable's text is read as its key's type, as pydantic reads it: ``60`` or ``2.5`` for a number,
``true`` / ``false`` (also ``1`` / ``0``, ``yes`` / ``no``, ``on`` / ``off``) for a boolean, JSON
for an array or a table; a value it cannot read is left as text for the configuration's strict
check to refuse, naming the variable. An empty variable counts as unset. Arrays of tables
(``[[replicas]]``, ``[[mcp_servers]]``) are file only: their entries have no stable name to put
in a variable (an index would silently move with the file's order), so a variable naming one
(``LUFTPAUSE_REPLICAS__0__URL``) is refused, as is one naming a table that does not exist
(``LUFTPAUSE_DATAPLAN__LISTEN``).

The variables are read by pydantic-settings (:class:`pydantic_settings.EnvSettingsSource`: the
prefix, the nested delimiter, the JSON of complex values). This module knows none of luftpause's
keys: it reads them from the model it is given (:class:`luftpause.config.Config`), so a key added
there gets its variable and its help line (its attribute docstring, which pydantic keeps as the
field's description) with no other change.
"""

from __future__ import annotations

import functools
import os
import re
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ENV_PREFIX = "LUFTPAUSE_"
ENV_DELIMITER = "__"

PRECEDENCE = "a flag beats its environment variable, which beats the --config file, which beats the default"

KeyPath = tuple[str, ...]
"""Where a value sits in the configuration: ``("dataplane", "listen")``."""

Source = tuple[str, KeyPath]
"""A variable or flag and the key it stands for: ``("LUFTPAUSE_RUNTIME", ("runtime",))`` for a
whole table's variable, ``("--listen", ("dataplane", "listen"))``."""


def env_name(path: Sequence[str]) -> str:
    """``("dataplane", "listen")`` -> ``"LUFTPAUSE_DATAPLANE__LISTEN"``."""
    return ENV_PREFIX + ENV_DELIMITER.join(part.upper() for part in path)


def flag_name(key: str) -> str:
    """``"state_dir"`` -> ``"--state-dir"``."""
    return "--" + key.replace("_", "-")


def model_class(annotation: Any) -> type[BaseModel] | None:
    """The model ``annotation`` is, or is optional of (``X | None``); else ``None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    members = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) is not tuple and len(members) == 1:
        return model_class(members[0])
    return None


def _array_item_class(annotation: Any) -> type[BaseModel] | None:
    """The table class of an array of tables (``tuple[ReplicaConfig, ...]``); else ``None``."""
    if get_origin(annotation) is tuple:
        args = get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return model_class(args[0])
    return None


def tables(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that are tables (``[scheduler]``...): the ones variables override."""
    found = {}
    for name, info in model.model_fields.items():
        table = model_class(info.annotation)
        if table is not None:
            found[name] = table
    return found


def arrays_of_tables(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that are arrays of tables (``[[replicas]]``...): file only."""
    found = {}
    for name, info in model.model_fields.items():
        item = _array_item_class(info.annotation)
        if item is not None:
            found[name] = item
    return found


@dataclass
class Layer:
    """Values laid over the file by one kind of source (variables, flags, or both stacked).

    ``values`` is nested as the file's tables are (``{"dataplane": {"listen": "..."}}``);
    ``sources`` names where each value set came from (``{("dataplane", "listen"): ("--listen",
    ("dataplane", "listen"))}``), for the errors; ``refused`` holds whole error lines
    (``"LUFTPAUSE_REPLICAS__0__URL: ..."``) for sources refused before any value is checked.
    """

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[KeyPath, Source] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def under(self, other: Layer) -> Layer:
        """This layer with ``other`` laid over it (``other`` wins where both set a key)."""
        return Layer(
            merge(self.values, other.values),
            {**self.sources, **other.sources},
            [*self.refused, *other.refused],
        )

    def source_of(self, loc: Sequence[str | int]) -> tuple[str, KeyPath] | None:
        """The variable or flag that set the value at ``loc`` (or a table or array around it),
        and the rest of ``loc`` past the key it stands for (``("max_depth",)`` for
        ``LUFTPAUSE_RUNTIME``'s JSON); ``None`` when no source of this layer set it."""
        for end in range(len(loc), 0, -1):
            source = self.sources.get(tuple(str(part) for part in loc[:end]))
            if source is not None:
                name, stands_for = source
                return name, tuple(str(part) for part in loc[len(stands_for) :])
        return None

    def sources_within(self, loc: Sequence[str | int]) -> list[str]:
        """The variables and flags that set values inside ``loc`` (a table a check refused whole)."""
        start = tuple(str(part) for part in loc)
        return list(
            dict.fromkeys(name for path, (name, _) in self.sources.items() if path[: len(start)] == start)
        )


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid over it, tables merged key by key, anything else replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _leaves(values: Mapping[str, Any], start: KeyPath = ()) -> Iterator[KeyPath]:
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, (*start, key))
        else:
            yield (*start, key)


def _field_at(model: type[BaseModel], path: KeyPath) -> FieldInfo | None:
    info: FieldInfo | None = None
    current: type[BaseModel] | None = model
    for key in path:
        if current is None or key not in current.model_fields:
            return None
        info = current.model_fields[key]
        current = model_class(info.annotation)
    return info


def _read_as_typed(model: type[BaseModel], path: KeyPath, value: Any) -> Any:
    """``value`` (a variable's or a flag's text) read as the type of the key at ``path``, in
    pydantic's lax mode (``"60"`` -> 60.0, ``"false"`` -> False); unchanged when it cannot be
    read so, or is not text: the strict check then refuses it with the key's own words."""
    info = _field_at(model, path)
    if not isinstance(value, str) or info is None or info.annotation in (None, str):
        return value
    try:
        return TypeAdapter(info.annotation).validate_python(value)
    except ValidationError:
        return value


def _set(values: dict[str, Any], path: KeyPath, value: Any) -> None:
    for key in path[:-1]:
        values = values.setdefault(key, {})
    values[path[-1]] = value


def _get(values: Mapping[str, Any], path: KeyPath) -> Any:
    for key in path:
        values = values[key]
    return values


@functools.cache
def _environment_shape(model: type[BaseModel]) -> type[Any]:
    """A pydantic-settings class with the variables' rule and ``model``'s tables, for its
    :class:`~pydantic_settings.EnvSettingsSource`. Each table is optional, so that a table no
    variable names stays out of the values, and a whole-table variable that is not a JSON object
    is kept as text, for the check to name. (Imported here: commands that read no configuration,
    ``fake-engine``, start without pydantic-settings.)"""
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class Rule(BaseSettings):
        model_config = SettingsConfigDict(
            env_prefix=ENV_PREFIX,
            env_nested_delimiter=ENV_DELIMITER,
            case_sensitive=False,
            env_ignore_empty=True,
        )

    shape: type[Any] = create_model(  # type: ignore[call-overload]
        f"{model.__name__}Environment",
        __base__=Rule,
        **{name: (table | None, None) for name, table in tables(model).items()},
    )
    return shape


def from_environment(model: type[BaseModel]) -> Layer:
    """The values ``LUFTPAUSE_<TABLE>__<KEY>`` variables set over the tables of ``model``.

    Variables naming an array of tables, or a table ``model`` does not have, are ``refused``;
    other ``LUFTPAUSE_*`` variables (``LUFTPAUSE_TOKEN``, ``LUFTPAUSE_CONFIG``) are not settings
    and are left alone.
    """
    table_classes = tables(model)
    arrays = arrays_of_tables(model)
    names = {name.upper(): name for name in os.environ if name.upper().startswith(ENV_PREFIX)}
    layer = Layer()
    for upper, name in sorted(names.items()):
        rest = upper[len(ENV_PREFIX) :]
        head = rest.split(ENV_DELIMITER, 1)[0].lower()
        if head in arrays:
            layer.refused.append(
                f"{name}: [[{head}]] is set in the configuration file only (an entry has no name a "
                "variable could use); no environment variable overrides it"
            )
        elif ENV_DELIMITER in rest and head not in table_classes:
            layer.refused.append(
                f"{name}: no table {head!r} to override; expected {ENV_PREFIX}<TABLE>{ENV_DELIMITER}<KEY> "
                f"with TABLE one of {', '.join(t.upper() for t in table_classes)}"
            )
    from pydantic_settings import EnvSettingsSource

    raw: dict[str, Any] = EnvSettingsSource(_environment_shape(model))()
    for path in _leaves(raw):
        _set(layer.values, path, _read_as_typed(model, path, _get(raw, path)))
        for end in range(len(path), 0, -1):  # the per-key variable, else the whole table's
            variable = names.get(env_name(path[:end]))
            if variable is not None:
                layer.sources[path] = (variable, path[:end])
                break
    return layer


def from_flags(model: type[BaseModel], flags: Mapping[KeyPath, tuple[str, str]]) -> Layer:
    """The values given as flags: ``{("dataplane", "listen"): ("--listen", "0.0.0.0:8080")}``."""
    layer = Layer()
    for path, (flag, text) in flags.items():
        _set(layer.values, path, _read_as_typed(model, path, text))
        layer.sources[path] = (flag, path)
    return layer


def toml_value(value: Any) -> str:
    """``value`` as a TOML user writes it: ``true`` not ``True``, ``["a"]`` not ``('a',)``,
    ``'x'`` (a TOML literal string) for a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, BaseModel):  # a table's value: its keys that are set, never a repr
        value = value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + "}"
    return repr(value)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`luftpause.x.y` -> luftpause.x.y
_LITERAL = re.compile(r"``([^`]*)``")  # ``host:port`` -> host:port


def plain_description(info: FieldInfo) -> str:
    """The key's description (its attribute docstring) as plain text: Sphinx roles and literal
    quotes dropped, whitespace folded; ``""`` when it has none."""
    text = _LITERAL.sub(r"\1", _ROLE.sub(r"\1", info.description or ""))
    return " ".join(text.split())


def default_text(info: FieldInfo) -> str:
    """``= <default>`` as TOML writes it, ``(unset)`` for ``None``, ``(required)`` for none."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "(required)"
    default = info.get_default(call_default_factory=True, validated_data={})
    return "(unset)" if default is None else f"= {toml_value(default)}"


def sub_table(info: FieldInfo) -> type[BaseModel] | None:
    """The table class of a key that is a sub-table (``[dataplane] limits``, ``tls``); else ``None``."""
    return model_class(info.annotation)


def _wrapped(head: str, info: FieldInfo, width: int) -> list[str]:
    """``head`` and the key's description below it, wrapped."""
    lines = [head.rstrip()]
    description = plain_description(info)
    if description:
        lines += textwrap.wrap(
            description,
            width,
            initial_indent=" " * 6,
            subsequent_indent=" " * 6,
            break_long_words=False,  # a URL or a path stays whole
            break_on_hyphens=False,
        )
    return lines


def _key_help(
    path: KeyPath, info: FieldInfo, flags: Mapping[KeyPath, str], file_only: bool, width: int
) -> list[str]:
    """One key's lines: ``  key = default  --flag  $VARIABLE`` and its description."""
    names = [] if file_only else [flags.get(path, ""), "$" + env_name(path)]
    key = ".".join(path[1:])
    return _wrapped(
        "  ".join(item for item in (f"  {key} {default_text(info)}", *names) if item), info, width
    )


def _sub_table_help(
    path: KeyPath, info: FieldInfo, sub: type[BaseModel], flags: Mapping[KeyPath, str], width: int
) -> list[str]:
    """A sub-table (``[dataplane.limits]``, ``[scheduler.protection.batch]``): its description,
    then each of its keys, which has a variable of its own
    (``LUFTPAUSE_DATAPLANE__LIMITS__BODY_TIMEOUT_S``), its own sub-tables in turn."""
    unset = "(unset) " if info.default is None else ""
    lines = _wrapped(f"  [{'.'.join(path)}] {unset}", info, width)
    for key, key_info in sub.model_fields.items():
        inner = sub_table(key_info)
        if inner is None:
            lines += _key_help((*path, key), key_info, flags, False, width)
        else:
            lines += _sub_table_help((*path, key), key_info, inner, flags, width)
    return lines


def help_text(
    model: type[BaseModel], parts: Sequence[str], flags: Mapping[KeyPath, str], width: int = 100
) -> str:
    """The settings a process reads, for its ``--help``: each key with its default, its flag and
    variable, and its description, grouped by table.

    ``parts`` names what it reads: a table (``"scheduler"``), an array of tables (``"replicas"``,
    listed as file only) or one key (``"scheduler.http"``); ``flags`` maps a key's path to its
    flag. ``KeyError`` for a part ``model`` does not have.
    """
    table_classes, arrays = tables(model), arrays_of_tables(model)
    groups: dict[str, list[str]] = {}
    for part in parts:
        table, _, only = part.partition(".")
        if table in table_classes:
            title, cls, file_only = f"[{table}]", table_classes[table], False
        elif table in arrays:
            title, cls, file_only = f"[[{table}]]  (file only)", arrays[table], True
        else:
            raise KeyError(part)
        keys = [only] if only else list(cls.model_fields)
        lines = groups.setdefault(title, [])
        for key in keys:
            info = cls.model_fields[key]
            sub = sub_table(info)
            if sub is None or file_only:
                lines += _key_help((table, key), info, flags, file_only, width)
                continue
            lines += _sub_table_help((table, key), info, sub, flags, width)
    heading = f"settings this process reads ({PRECEDENCE}; docs/operating.md: Configuration):"
    out = textwrap.wrap(heading, width)
    for title, lines in groups.items():
        out += ["", title, *lines]
    return "\n".join(out)
