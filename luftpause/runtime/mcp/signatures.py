"""Tool functions whose signatures are generated from a pydantic model, so the SDK derives their
input schemas from the one declaration of a contract (``spawn``'s :class:`SpawnArguments`).

The ``mcp`` SDK builds a tool's argument model and input schema from its function's signature
(``inspect.signature`` and ``typing.get_type_hints``: ``mcp.server.mcpserver.utilities.
func_metadata``). :func:`tool_function` gives it a function whose ``__signature__`` and
``__annotations__`` list the model's fields under their wire names (aliases), each annotated with
the field's type, constraints and description and defaulted as the field is (or as ``overrides``
says for a field whose values are only known at run time: ``spawn``'s ``model``, an enum of the
models served), followed by the ``extra`` parameters (e.g. ``run``'s ``timeout``, the SDK
``Context``). The function calls
``impl(arguments, **extra)`` with the model validated from the wire names, so constraints the
schema cannot express (a text's size in UTF-8 bytes) are checked too.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field
from pydantic_core import PydanticUndefined

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Override:
    """A field's parameter as a tool declares it instead of as the model does: its ``annotation``
    (type, constraints and ``Field``) and ``default``. The model still validates the value."""

    annotation: Any
    default: Any


def model_parameters(
    model: type[BaseModel], overrides: Mapping[str, Override] | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter per field of ``model``, named by its wire name (alias), annotated
    ``Annotated[type, *constraints, Field(description=..., json_schema_extra=...)]``, with the
    field's default (required fields have none); a field named (by wire name) in ``overrides`` is
    annotated and defaulted as its :class:`Override` says."""
    out = []
    for name, field in model.model_fields.items():
        metadata = [
            *field.metadata,
            Field(description=field.description, json_schema_extra=field.json_schema_extra),
        ]
        # Built at run time from the field: Annotated[type, *metadata].
        annotation = operator.getitem(Annotated, (field.annotation, *metadata))
        default = inspect.Parameter.empty if field.default is PydanticUndefined else field.default
        override = (overrides or {}).get(field.alias or name)
        if override is not None:
            annotation, default = override.annotation, override.default
        out.append(
            inspect.Parameter(
                field.alias or name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return out


def tool_function(
    name: str,
    model: type[Model],
    impl: Callable[..., Awaitable[Any]],
    extra: Sequence[inspect.Parameter] = (),
    returns: Any = inspect.Signature.empty,
    overrides: Mapping[str, Override] | None = None,
) -> Callable[..., Awaitable[Any]]:
    """An async function named ``name`` taking ``model``'s fields (by wire name, ``overrides`` as
    :func:`model_parameters` takes them) and ``extra``, calling ``impl(model instance, **extra
    arguments)``; its return annotation is ``returns``. Parameters in ``extra`` without a default
    must come first among them (Python's rule)."""
    fields = model_parameters(model, overrides)
    names = {p.name for p in fields}
    parameters = [*fields, *extra]
    signature = inspect.Signature(parameters, return_annotation=returns)

    async def tool(**kwargs: Any) -> Any:
        arguments = model.model_validate({k: v for k, v in kwargs.items() if k in names})
        return await impl(arguments, **{k: v for k, v in kwargs.items() if k not in names})

    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = signature  # type: ignore[attr-defined]
    annotations = {p.name: p.annotation for p in parameters}
    if returns is not inspect.Signature.empty:
        annotations["return"] = returns
    tool.__annotations__ = annotations
    return tool
