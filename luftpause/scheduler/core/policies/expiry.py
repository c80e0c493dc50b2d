"""Expiry: a placed turn with no completion after 10 min is dropped and its slot freed; a run with
no turn for 30 min (``[scheduler] run_expiry_s``) is forgotten (its next turn starts with no
affinity).

Reads: the placed turn's placement time; the run's last activity and whether it has held or placed
turns (a run with a turn is never forgotten). Times are seconds of the shell's monotonic clock.
"""

from __future__ import annotations

from luftpause.v1.contract import TURN_EXPIRY_S

__all__ = ["RUN_EXPIRY_S", "TURN_EXPIRY_S", "run_expired", "turn_expired"]

RUN_EXPIRY_S = 1800.0


def turn_expired(placed_at: float, now: float) -> bool:
    """True when a turn placed at ``placed_at`` has had no completion for too long."""
    return now - placed_at >= TURN_EXPIRY_S


def run_expired(last_activity: float, now: float, run_expiry_s: float = RUN_EXPIRY_S) -> bool:
    """True when a run last active at ``last_activity`` may be forgotten (if it has no turn);
    ``run_expiry_s``: seconds with no turn after which it is."""
    return now - last_activity >= run_expiry_s
