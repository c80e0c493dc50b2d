"""The last minutes of a process as small time series: a bounded ring of samples, served as JSON
to the live pages (the scheduler's ``GET /series``, the runtime's ``GET /monitor/series``), which
draw them as inline SVG.

A process takes one sample every :data:`INTERVAL_S` (2 s, the pages' poll) and keeps the last
:data:`WINDOW_S` (10 min): :class:`SeriesRing` holds at most ``capacity`` (300) samples in a
``deque`` with that ``maxlen``, so memory is bounded by the capacity times one sample, whatever the
uptime; the oldest sample leaves as the newest arrives. A sample is a small JSON object of counts
and seconds chosen by its process (:mod:`luftpause.scheduler.series`,
:mod:`luftpause.runtime.runs.series`). A value measured over the interval (time to first token)
is gathered by a :class:`Window`, itself bounded: at most :data:`MAX_OBSERVATIONS` values kept per
interval (reservoir sampling past that, the count and maximum exact).

JSON (:meth:`SeriesRing.since`)::

    {"version": 1,
     "boot": str,          # this ring's id: a page that holds samples of another boot drops them
     "interval_s": 2.0, "window_s": 600.0, "capacity": 300,
     "next": int,          # the seq the next sample will have
     "samples": [{"seq": int, "t": float, ...the process's values}, ...]}   # oldest first

``t`` is Unix seconds (wall clock, for the page's time axis); ``seq`` counts samples from 0 in
this boot. ``?after=SEQ`` (the last seq a page holds) answers only the samples after it, so a page
polling every 2 s gets one sample per poll, not the whole window.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("luftpause.series")

INTERVAL_S = 2.0
"""Seconds between two samples."""
WINDOW_S = 600.0
"""Seconds of samples kept: the pages show the last 10 minutes."""
MAX_OBSERVATIONS = 4096
"""Values a :class:`Window` keeps per interval for its quantiles."""
VERSION = 1
"""The JSON shape's version (the module docstring)."""


class SeriesRing:
    """The last ``window_s`` of samples taken every ``interval_s``: at most ``capacity`` (their
    ratio, rounded up) samples; adding one past that drops the oldest."""

    def __init__(self, interval_s: float = INTERVAL_S, window_s: float = WINDOW_S) -> None:
        if not (interval_s > 0 and window_s >= interval_s):
            raise ValueError(f"need 0 < interval_s <= window_s, got {interval_s!r} and {window_s!r}")
        self.interval_s = interval_s
        self.window_s = window_s
        self.capacity = math.ceil(window_s / interval_s)
        self.boot = secrets.token_hex(4)
        self._samples: deque[dict[str, Any]] = deque(maxlen=self.capacity)
        self._next = 0

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, at: float, values: Mapping[str, Any]) -> dict[str, Any]:
        """Append a sample taken at ``at`` (Unix seconds) with ``values``; the sample as stored.
        ``values`` must not use the keys ``seq`` and ``t``."""
        sample = {"seq": self._next, "t": round(at, 3), **values}
        self._next += 1
        self._samples.append(sample)
        return sample

    def since(self, after: int | None = None) -> dict[str, Any]:
        """The JSON answer (module docstring): every sample kept, or those after seq ``after``."""
        samples = list(self._samples)
        if after is not None:
            first = self._samples[0]["seq"] if self._samples else self._next
            samples = samples[max(after + 1 - first, 0) :]  # older than the ring: all of it
        return {
            "version": VERSION,
            "boot": self.boot,
            "interval_s": self.interval_s,
            "window_s": self.window_s,
            "capacity": self.capacity,
            "next": self._next,
            "samples": samples,
        }


def parse_after(value: str | None) -> int | None:
    """A request's ``?after=`` as a seq; None when absent. Raises ``ValueError`` with what was
    expected for anything but a whole number of 0 or more (the route answers 400)."""
    if value is None or value == "":
        return None
    if not value.isdigit() or not value.isascii():
        raise ValueError(f"after: expected the seq of a sample (a whole number, 0 or more), got {value!r}")
    return int(value)


class Window:
    """Values observed during one interval (seconds, e.g. times to first token), summarized and
    emptied by :meth:`take`. Bounded: past :data:`MAX_OBSERVATIONS` values a uniform sample of
    them is kept (Vitter's algorithm R), while the count and the maximum stay exact."""

    __slots__ = ("_kept", "_max", "_n", "_random")

    def __init__(self, seed: int | None = None) -> None:
        self._kept: list[float] = []
        self._n = 0
        self._max = 0.0
        self._random = random.Random(seed)

    def add(self, value: float) -> None:
        self._n += 1
        if value > self._max or self._n == 1:
            self._max = value
        if len(self._kept) < MAX_OBSERVATIONS:
            self._kept.append(value)
        else:
            slot = self._random.randrange(self._n)
            if slot < MAX_OBSERVATIONS:
                self._kept[slot] = value

    def take(self) -> dict[str, Any]:
        """``{"n": count, "p50", "p95", "max"}`` of the values since the last take (seconds,
        rounded to 0.1 ms; the quantiles by nearest rank; all three None when nothing was
        observed), and start a new interval."""
        kept, n, peak = sorted(self._kept), self._n, self._max
        self._kept, self._n, self._max = [], 0, 0.0
        if not n:
            return {"n": 0, "p50": None, "p95": None, "max": None}

        def rank(q: float) -> float:
            return round(kept[max(math.ceil(q * len(kept)) - 1, 0)], 4)

        return {"n": n, "p50": rank(0.5), "p95": rank(0.95), "max": round(peak, 4)}


async def sample_every(
    ring: SeriesRing, sample: Callable[[], Mapping[str, Any]], clock: Callable[[], float] = time.time
) -> None:
    """Add ``sample()`` to ``ring`` now and then every ``ring.interval_s`` until cancelled (the
    caller's task). A sample that raises is skipped and the next one taken on time."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        try:
            values = sample()
        except Exception:  # one bad sample must not end the series
            log.exception("a sample of the time series failed")
        else:
            ring.add(clock(), values)
        next_at += ring.interval_s
        await asyncio.sleep(max(next_at - loop.time(), 0.0))
