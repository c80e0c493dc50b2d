"""The scheduler's trace: the arrivals, tool pauses and run ends it saw, as JSON lines (opt-in).

``[scheduler] trace = "PATH"`` makes the scheduler append one line per fact to ``PATH``, so that an
operator can replay their own traffic offline under another policy (``bench/flood_sim.py --replay
PATH``, :mod:`luftpause.testkit.sim.replay`). The first line of each scheduler start is a header;
times ``t`` are seconds since that start (the shell's monotonic clock), so a file holding several
starts replays the last one. Lines (every key always present):

* ``{"trace": "luftpause-scheduler", "version": 1, "started": "<ISO 8601 UTC>"}``: a start;
* ``{"t", "e": "arrived", "turn", "run", "class", "caller", "model"}``: a new generative turn
  (an Admit, or a turn placed under a capacity lease); retried Admits and single-pass turns are
  not written;
* ``{"t", "e": "finished", "turn", "tools", "prompt", "completion"}``: its engine completed it;
  ``tools``: the reply asked for tools, so the run pauses on a tool round until its next turn
  arrives; ``prompt`` and ``completion``: the usage's tokens;
* ``{"t", "e": "failed", "turn"}`` and ``{"t", "e": "abandoned", "turn"}``: it ended otherwise;
* ``{"t", "e": "run_ended", "run"}``: ``DELETE /v1/runs/{id}``.

Run ids, callers and models are written as they came (what the scheduler sees; no prompt text
ever reaches it). Lines are buffered and flushed on every clock tick (1 s) and on close; a line
that cannot be written is dropped with one warning, never fatal to admission.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import IO

import orjson

from luftpause.scheduler.core import (
    AbandonReported,
    Event,
    LeasedTurnPlaced,
    RunEnded,
    TurnAbandoned,
    TurnArrived,
    TurnFailed,
    TurnFinished,
)

log = logging.getLogger("luftpause.scheduler")

TRACE_VERSION = 1


class TraceRecorder:
    """Appends what the scheduler sees to ``path``; ``start`` is the clock reading that is t = 0."""

    def __init__(self, path: Path, start: float) -> None:
        self.path = path
        self.start = start
        self._file: IO[bytes] | None = path.open("ab")
        self._failed = False
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._write({"trace": "luftpause-scheduler", "version": TRACE_VERSION, "started": started})

    def record(self, event: Event, new_turn: bool) -> None:
        """Write ``event`` if it is one the trace keeps; ``new_turn``: an arrival the core has not
        seen under that turn id (a retried Admit is not a new arrival)."""
        line: dict[str, object] | None = None
        if type(event) is TurnArrived or type(event) is LeasedTurnPlaced:
            if new_turn and not getattr(event, "single_pass", False):
                line = {
                    "e": "arrived",
                    "turn": event.turn_id,
                    "run": event.run_id,
                    "class": event.service_class,
                    "caller": event.caller,
                    "model": event.model,
                }
        elif type(event) is TurnFinished:
            line = {
                "e": "finished",
                "turn": event.turn_id,
                "tools": event.tool_calls,
                "prompt": event.prompt_tokens,
                "completion": event.completion_tokens,
            }
        elif type(event) is TurnFailed:
            line = {"e": "failed", "turn": event.turn_id}
        elif type(event) is TurnAbandoned or type(event) is AbandonReported:
            line = {"e": "abandoned", "turn": event.turn_id}
        elif type(event) is RunEnded:
            line = {"e": "run_ended", "run": event.run_id}
        if line is not None:
            self._write({"t": round(event.at - self.start, 6), **line})

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                self._give_up(exc)

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, line: dict[str, object]) -> None:
        if self._file is None:
            return
        try:
            self._file.write(orjson.dumps(line) + b"\n")
        except OSError as exc:
            self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        if not self._failed:
            log.warning("scheduler trace %s: %s; no more lines are written", self.path, exc)
        self._failed = True
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass
