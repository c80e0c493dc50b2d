"""What the tracing tests, in-process (``common/test_spans_in_process.py``) and across a real stack
(``stack/test_one_trace_across_processes.py``), both ask of a span."""

from __future__ import annotations

from typing import Any


def llm_typed(attributes: Any) -> bool:
    """Whether an LLM-observability backend types a span with ``attributes`` as an LLM call: Arize
    Phoenix's rule (``phoenix.trace.gen_ai.conversion._infer_span_kind``, 20.x), an operation named
    ``chat``, ``text_completion`` or ``generate_content``, or no operation and a request model."""
    operation = attributes.get("gen_ai.operation.name")
    if operation is None:
        return "gen_ai.request.model" in attributes or "gen_ai.input.messages" in attributes
    return operation in ("chat", "text_completion", "generate_content")
