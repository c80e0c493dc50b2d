"""Order of held turns of one class and caller: whose run goes first.

Under a flood, a replica's engine serves far more runs than its KV pool can keep the prefixes of.
Served turn by turn in arrival order (``"turn"``, the order before this policy, and what an engine's
FIFO queue does), every run in progress interleaves with every other, so each run's prefix has to
survive the turns of all the others while it waits, and the prefix cache thrashes: under the
published flood the engine model finds 0-4 % of batch prompt tokens cached (bench/README.md,
"Floods in virtual time"). Served run by run (``"run"``, the default), the run that started first
goes first: a run already in progress is never kept waiting for a run that started after it, so only
a few runs are in progress on a replica at once, their prefixes stay cached, and new runs wait at
their first turn, which has nothing cached to lose. This is program-level first-come first-served
(the baseline of Autellix, arXiv 2502.13965); no run starves, since every waiting run becomes the
oldest in time.

``"plas"``: Autellix's program-level attained service, the run that has had the *least* engine time
so far goes first (its remedy for head-of-line blocking by long programs, for programs of unknown
length sharing an engine). Measured on this closed loop it keeps many runs in progress, as
``"turn"`` does, and loses to ``"run"`` (bench/README.md); kept for measuring.

Reads: the run's start number (``Run.order``, given when the scheduler first saw the run), its
attained service (``Run.attained_s``: seconds its turns were placed, summed as they end) and the
turn's arrival number. The rank is fixed when the turn is filed (a held turn's run has no other turn
running meanwhile); caller fairness and class come before it (:mod:`.ordering`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Run

RunOrder = Literal["turn", "run", "plas"]
RUN_ORDERS: tuple[RunOrder, ...] = ("turn", "run", "plas")


def rank(mode: RunOrder, run: Run | None, seq: int) -> float:
    """The rank of a turn arriving as number ``seq`` for ``run`` (``None``: no run, a single-pass
    turn): smaller goes first, ties by arrival."""
    if run is None or mode == "turn":
        return float(seq)
    if mode == "run":
        return float(run.order)
    return run.attained_s
