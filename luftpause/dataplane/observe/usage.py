"""Tokens used per caller and model: what to bill or budget on (docs/operating-metrics.md).

Every finished turn adds the tokens its engine reported (``usage``: prompt, completion, and the
prompt tokens its prefix cache served) under the turn's *billed caller* and its model. The billed
caller is the root of the turn's caller (``team-a`` for ``team-a/job-7``, :func:`root_of`) when
that root is configured (a caller key's caller, or a name of ``[scheduler.protection] callers``),
``anonymous`` for the shared anonymous caller, and ``other`` for any other: so the table is
bounded by the configuration, whatever callers clients name in ``x-luftpause-caller``. With caller
keys a client cannot name another key's caller, so the figures per key are the key's own.

Two spans of time: the process's life, and fixed windows of ``window_s`` seconds aligned on the
wall clock (``window_s = 3600``: each hour from :00, UTC), the current one and the one before it.
A window is kept in memory only; across restarts and across several dataplanes, sum the counter
``luftpause_dataplane_tokens_total`` in Prometheus instead (the same figures, by the same labels).

Cost: nothing of its own per turn but a clock read (the tokens are the metrics'
:class:`~luftpause.dataplane.observe.answer_metrics.AnswerMetrics` counts, folded when asked for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

ANONYMOUS = "anonymous"
"""The billed caller of the shared anonymous caller (``""``)."""
OTHER = "other"
"""The billed caller of every caller whose root is not configured."""

Totals = dict[tuple[str, str], tuple[int, int, int, int]]
"""``{(billed caller, model): (prompt tokens, completion tokens, cached prompt tokens, turns)}``."""


def root_of(caller: str) -> str:
    """The root of ``caller``: the part before its first ``/`` (docs/architecture.md "Rules")."""
    return caller.partition("/")[0]


class CallerLabels:
    """The bounded name a caller is counted under: its root when configured, ``anonymous`` for
    ``""``, else ``other``. ``CallerLabels(configured)``: the configured roots."""

    __slots__ = ("_known",)

    def __init__(self, configured: Iterable[str]) -> None:
        self._known: dict[str, str] = {root_of(name): root_of(name) for name in configured if name}
        self._known[""] = ANONYMOUS

    def __call__(self, caller: str) -> str:
        known = self._known.get(caller)
        if known is not None:
            return known
        return self._known.get(root_of(caller), OTHER)

    @property
    def names(self) -> list[str]:
        """Every label a caller may get: the configured roots, ``anonymous`` and ``other``."""
        return [*sorted(set(self._known.values()) - {ANONYMOUS}), ANONYMOUS, OTHER]


def _table(totals: Totals, since: Totals) -> list[dict[str, Any]]:
    """The rows of ``totals`` less ``since`` (totals taken earlier), those with a turn."""
    rows = []
    for (caller, model), counts in sorted(totals.items()):
        before = since.get((caller, model), (0, 0, 0, 0))
        prompt, completion, cached, turns = (now - then for now, then in zip(counts, before, strict=True))
        if turns:
            rows.append(
                {
                    "caller": caller,
                    "model": model,
                    "promptTokens": prompt,
                    "completionTokens": completion,
                    "cachedPromptTokens": cached,
                    "turns": turns,
                }
            )
    return rows


class Usage:
    """Token totals per (billed caller, model), over the process's life and per window.

    ``Usage(window_s, clock, totals)``: ``window_s`` seconds per window (at least 1), ``clock``
    the wall clock in seconds since the epoch (``time.time``), ``totals`` the life totals now
    (:data:`Totals`; the dataplane folds them from its metrics, so a turn is counted once, there).
    A window's figures are the life totals at its end less those at its start: the owner calls
    :meth:`roll` before it counts each turn, which takes the totals as they stand when a window
    has begun since (the first window counts from the process's start).
    """

    def __init__(self, window_s: float, clock: Callable[[], float], totals: Callable[[], Totals]) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be at least 1, not {window_s}")
        self.window_s = window_s
        self._clock = clock
        self._totals = totals
        self._index = int(clock() // window_s)
        self._ends_at = (self._index + 1) * window_s
        self._at_current: Totals = {}  # life totals when the current window began
        self._at_previous: Totals = {}  # ... and when the one before it began

    def roll(self) -> None:
        """Start a new window if the wall clock has passed the current one's end (one clock read
        and one comparison while it has not)."""
        now = self._clock()
        if now < self._ends_at:
            return
        index = int(now // self.window_s)
        totals = self._totals()
        # A window with no turn at all in between: the one before is empty.
        self._at_previous = self._at_current if index == self._index + 1 else totals
        self._at_current = totals
        self._index = index
        self._ends_at = (index + 1) * self.window_s

    def report(self) -> dict[str, Any]:
        """The JSON of ``GET /status``'s ``usage`` and ``GET /admin/usage``::

            {"windowSeconds": 3600,
             "life": [{"caller", "model", "promptTokens", "completionTokens",
                       "cachedPromptTokens", "turns"}, ...],
             "current": {"start": epoch seconds, "end": epoch seconds, "usage": [...]},
             "previous": {"start", "end", "usage": [...]}}

        Rows are sorted by caller, then model; a caller and model with no finished turn in a span
        has no row there."""
        self.roll()
        totals = self._totals()
        start = self._index * self.window_s
        return {
            "windowSeconds": self.window_s,
            "life": _table(totals, {}),
            "current": {
                "start": start,
                "end": start + self.window_s,
                "usage": _table(totals, self._at_current),
            },
            "previous": {
                "start": start - self.window_s,
                "end": start,
                "usage": _table(self._at_current, self._at_previous),
            },
        }
