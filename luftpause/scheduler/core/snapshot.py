"""``snapshot(state, now) -> dict``: what ``GET /status`` shows, as plain JSON-ready values.

Shape (every key always present; counts are integers, times seconds)::

    {
      "replicas": [{"name": str, "kind": "generative" | "single_pass", "models": [str, ...],
                    "inflight": int, "capacity": int}, ...],          # configuration order
      "held": {"count": int,
               "by_class": {"interactive": int, "batch": int},
               "by_caller": {caller: int, ...},                     # "" is the anonymous caller
               "oldest_wait_s": float},                             # 0.0 when nothing is held
      "runs": {"idle": int, "generating": int, "tool_paused": int},
      "runs_by_class": {"interactive": int, "batch": int},
      "counters": {"arrived": int, "admitted": int, "adopted": int, "finished": int, "failed": int,
                   "rejected": int, "abandoned": int, "expired_turns": int, "expired_runs": int,
                   "runs_ended": int}
    }
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from luftpause.scheduler.core.events import RUN_PHASES, SERVICE_CLASSES
from luftpause.scheduler.core.state import State


def snapshot(state: State, now: float) -> dict[str, Any]:
    """The state at ``now`` (the shell's monotonic seconds) in the shape above. Reads only."""
    by_class = dict.fromkeys(SERVICE_CLASSES, 0)
    by_caller: dict[str, int] = {}
    for turn in state.held:
        by_class[turn.service_class] = by_class.get(turn.service_class, 0) + 1
        by_caller[turn.caller] = by_caller.get(turn.caller, 0) + 1
    oldest = state.held.oldest()
    runs = dict.fromkeys(RUN_PHASES, 0)
    runs_by_class = dict.fromkeys(SERVICE_CLASSES, 0)
    for run in state.runs.values():
        runs[run.phase] = runs.get(run.phase, 0) + 1
        runs_by_class[run.service_class] = runs_by_class.get(run.service_class, 0) + 1
    return {
        "replicas": [
            {
                "name": replica.name,
                "kind": replica.kind,
                "models": list(replica.models),
                "inflight": replica.inflight,
                "capacity": replica.max_inflight,
            }
            for replica in state.replicas.values()
        ],
        "held": {
            "count": len(state.held),
            "by_class": by_class,
            "by_caller": by_caller,
            "oldest_wait_s": max(0.0, now - oldest.arrived_at) if oldest is not None else 0.0,
        },
        "runs": runs,
        "runs_by_class": runs_by_class,
        "counters": asdict(state.counters),
    }
