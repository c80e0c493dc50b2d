"""Pick the fact scanners for natively served Messages and Responses answers: the compiled twins if
they were built, else the pure-Python ones.

The compiled twins (``_speedups/_facts_c.pyx``, built as ``luftpause.dataplane.apis._facts_c``) are
dialects of the compiled chat scanner (``_speedups/_sse_c.pyx``: the same framing, another reading
of each payload), so the chat scanner's selector decides:
``LUFTPAUSE_NO_EXTENSIONS`` forces the pure twins, and ``USING_EXTENSION`` is
``luftpause.dataplane.sse``'s. The interface (see ``_facts_py``): ``MessagesScanner`` and
``ResponsesScanner`` with the chat scanner's ``feed(chunk) -> bool`` and attributes plus
``stop_reason``; ``message_facts(body)`` and ``response_facts(body)`` for whole answers (pure
Python on either side: one parse per answer, nothing to gain).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from luftpause.dataplane.apis._facts_py import message_facts, response_facts
from luftpause.dataplane.sse import USING_EXTENSION

__all__ = ["USING_EXTENSION", "MessagesScanner", "ResponsesScanner", "message_facts", "response_facts"]

if TYPE_CHECKING or not USING_EXTENSION:
    from luftpause.dataplane.apis._facts_py import MessagesScanner, ResponsesScanner
else:
    from luftpause.dataplane.apis._facts_c import MessagesScanner, ResponsesScanner
