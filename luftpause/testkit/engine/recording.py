"""What the simulator keeps of the requests it answered, for ``/testkit/*`` (bounded)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

__all__ = ["REQUEST_BYTES_KEPT", "SENT_KEPT", "KeptRequestBodies", "keep"]

_T = TypeVar("_T")

# How many completed responses GET /testkit/sent/{id} (and .../received/{id}) can still show.
SENT_KEPT = 256

# At most this many bytes of request bodies are kept for GET /testkit/request/{id}: SENT_KEPT whole
# bodies at the dataplane's 32 MiB request limit would be 8 GiB per engine (the benchmarks run it).
REQUEST_BYTES_KEPT = 64 * 1024 * 1024


def keep(kept: OrderedDict[str, _T], key: str, value: _T) -> None:
    """Remember ``value`` under ``key``, forgetting the oldest beyond ``SENT_KEPT`` entries."""
    kept[key] = value
    while len(kept) > SENT_KEPT:
        kept.popitem(last=False)


class KeptRequestBodies:
    """The request bodies of the last ``SENT_KEPT`` completions, ``limit_bytes`` bytes at most in
    all: keeping one drops the oldest until it fits. A body longer than ``limit_bytes`` is not kept;
    its id and length (bytes) are remembered instead (the last ``SENT_KEPT`` such), so that a
    lookup can say why it finds nothing."""

    def __init__(self, limit_bytes: int = REQUEST_BYTES_KEPT) -> None:
        self.limit_bytes = limit_bytes
        self.total_bytes = 0
        self._bodies: OrderedDict[str, bytes] = OrderedDict()
        self._too_large: OrderedDict[str, int] = OrderedDict()

    def keep(self, completion_id: str, body: bytes) -> None:
        """Keep ``body`` as completion ``completion_id``'s (see the class)."""
        if len(body) > self.limit_bytes:
            keep(self._too_large, completion_id, len(body))
            return
        self._bodies[completion_id] = body
        self.total_bytes += len(body)
        while self.total_bytes > self.limit_bytes or len(self._bodies) > SENT_KEPT:
            self.total_bytes -= len(self._bodies.popitem(last=False)[1])

    def get(self, completion_id: str) -> bytes | None:
        """The body kept for ``completion_id``; ``None`` when none is (unknown, dropped, too large)."""
        return self._bodies.get(completion_id)

    def too_large(self, completion_id: str) -> int | None:
        """The length in bytes of ``completion_id``'s body when it was not kept for being longer
        than ``limit_bytes``; ``None`` otherwise."""
        return self._too_large.get(completion_id)
