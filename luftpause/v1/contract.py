"""Numbers of the scheduler–dataplane contract that ``scheduler.proto`` does not carry, shared by
both sides from here (a neutral module: the dataplane imports nothing of the scheduler's core).
No imports: the scheduler's pure core reads it too."""

from __future__ import annotations

TURN_EXPIRY_S = 600.0
"""Seconds a placed turn may go without a completion before the scheduler drops it (its slot
freed, its run idle); the dataplane's engine read timeout by default, so an engine silent that
long fails the turn on both sides alike."""
