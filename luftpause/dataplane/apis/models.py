"""``GET /v1/models`` (and ``GET /v1/models/{id}``) in the shape each client expects.

An OpenAI client reads ``{"object": "list", "data": [{"id", "object": "model", "created",
"owned_by"}]}`` (OpenAI API reference, "Models"). The ``anthropic`` SDK (``client.models.list()``,
checked with 2.15) sends ``anthropic-version`` on every request and reads a page
``{"data": [{"type": "model", "id", "display_name", "created_at"}], "has_more", "first_id",
"last_id"}`` (Anthropic API reference, "List Models": ``created_at`` an RFC 3339 time), asking for
the next page while ``has_more`` is true. :func:`wants_anthropic` tells the two apart by that
header, so each client gets its own shape and nothing it does not expect.

All models are on one page (a dataplane serves a handful), so ``has_more`` is false.
``created_at`` / ``created`` are the Unix epoch: luftpause does not know when a model was made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["ANTHROPIC_VERSION_HEADER", "model_body", "models_body", "wants_anthropic"]

ANTHROPIC_VERSION_HEADER = "anthropic-version"
_EPOCH = "1970-01-01T00:00:00Z"


def wants_anthropic(anthropic_version: str | None) -> bool:
    """Whether a request with this ``anthropic-version`` header value (``None``: absent) is from an
    Anthropic client."""
    return bool(anthropic_version)


def _model(model: str, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        return {"type": "model", "id": model, "display_name": model, "created_at": _EPOCH}
    return {"id": model, "object": "model", "created": 0, "owned_by": "luftpause"}


def models_body(models: Sequence[str], anthropic: bool) -> bytes:
    """The model list as JSON bytes, in the Anthropic page shape or the OpenAI list shape."""
    data = [_model(m, anthropic) for m in models]
    if anthropic:
        page: dict[str, Any] = {
            "data": data,
            "has_more": False,
            "first_id": models[0] if models else None,
            "last_id": models[-1] if models else None,
        }
        return orjson.dumps(page)
    return orjson.dumps({"object": "list", "data": data})


def model_body(models: Sequence[str], model: str, anthropic: bool) -> bytes | None:
    """One model as JSON bytes, or ``None`` when no replica serves it (the route answers 404)."""
    if model not in models:
        return None
    return orjson.dumps(_model(model, anthropic))
