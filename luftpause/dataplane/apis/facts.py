"""Pick the fact scanners for natively served Messages and Responses answers.

Only the pure-Python twin exists yet (``_facts_py``); the compiled one (``_speedups/``) is to come,
selected here as ``luftpause.dataplane.sse`` selects the chat scanner (``LUFTPAUSE_NO_EXTENSIONS``
forcing the pure twin). The interface (see ``_facts_py``): ``MessagesScanner`` and
``ResponsesScanner`` with the chat scanner's ``feed(chunk) -> bool`` and attributes plus
``stop_reason``; ``message_facts(body)`` and ``response_facts(body)`` for whole answers.
"""

from __future__ import annotations

from luftpause.dataplane.apis._facts_py import (
    MessagesScanner,
    ResponsesScanner,
    message_facts,
    response_facts,
)

__all__ = ["USING_EXTENSION", "MessagesScanner", "ResponsesScanner", "message_facts", "response_facts"]

USING_EXTENSION = False
"""Whether the compiled twin was taken (not built yet)."""
