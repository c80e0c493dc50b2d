"""``POST /classify``: vLLM's classification (pooling) API, answered by a simulated single-pass model.

Request (vLLM ``ClassificationRequest``; SGLang serves the same shape on ``/v1/classify``)::

    {"model": str, "input": str | [str], "priority": int?, "user": str?}

Response (vLLM ``ClassificationResponse``)::

    {"id": "classify-<hex>", "object": "list", "created": <unix s>, "model": str,
     "data": [{"index": i, "label": str, "probs": [float, ...], "num_classes": n}, ...],
     "usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0, "prompt_tokens_details": null}}

The simulated model is a fixed function of the text: each label's logit comes from a hash of the
seed, the label and the input, ``probs`` are their softmax (in label order, summing to 1) and
``label`` is the most probable one. So the same input gets the same answer on every replica and in
every run, and different inputs get different answers.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.costs import CHARS_PER_TOKEN
from luftpause.testkit.engine.toolargs import stable_int
from luftpause.testkit.engine.wire import RequestError, parse_json_body

# Logits are drawn from [-LOGIT_SPAN / 2, +LOGIT_SPAN / 2]: wide enough for clear winners.
LOGIT_SPAN = 6.0


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    """A validated ``/classify`` request: the model and one or more input texts."""

    model: str
    inputs: tuple[str, ...]
    priority: int = 0


def parse_classify_request(raw: bytes, served: Sequence[str]) -> ClassifyRequest:
    """Validate a ``/classify`` body; raises :class:`.wire.RequestError` (400 malformed, 404
    unknown model)."""
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' must be a non-empty string", "model")
    given = body.get("input")
    inputs = [given] if isinstance(given, str) else given
    if not isinstance(inputs, list) or not inputs or not all(isinstance(text, str) for text in inputs):
        raise RequestError(400, "'input' must be a string or a non-empty list of strings", "input")
    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise RequestError(400, "'priority' must be an integer", "priority")
    if model not in served:
        raise RequestError(404, f"The model `{model}` does not exist.", "model")
    return ClassifyRequest(model=model, inputs=tuple(inputs), priority=priority)


def text_tokens(text: str) -> int:
    """Tokens of one input, estimated as characters / 4 (at least 1), as for chat prompts."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def class_probabilities(text: str, labels: Sequence[str], seed: int) -> list[float]:
    """Softmax over hashed logits, one per label in ``labels`` order; sums to 1."""
    logits = [
        (stable_int(seed, "classify", label, text) % 10_000) / 10_000 * LOGIT_SPAN - LOGIT_SPAN / 2
        for label in labels
    ]
    top = max(logits)
    weights = [math.exp(logit - top) for logit in logits]
    total = sum(weights)
    return [w / total for w in weights]


def classification_response(request: ClassifyRequest, labels: Sequence[str], seed: int) -> dict[str, Any]:
    """The ``ClassificationResponse`` object for ``request`` (see the module docstring)."""
    data = []
    for index, text in enumerate(request.inputs):
        probs = class_probabilities(text, labels, seed)
        best = max(range(len(labels)), key=probs.__getitem__)
        data.append({"index": index, "label": labels[best], "probs": probs, "num_classes": len(labels)})
    prompt_tokens = sum(text_tokens(text) for text in request.inputs)
    return {
        "id": f"classify-{secrets.token_hex(16)}",
        "object": "list",
        "created": int(time.time()),
        "model": request.model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }
