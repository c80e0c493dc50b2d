"""``snapshot(state, now) -> dict``: what ``GET /status`` shows, as plain JSON-ready values.

Shape (every key always present; counts are integers, times seconds, fractions 0..1)::

    {
      "replicas": [{"name": str, "kind": "generative" | "single_pass", "models": [str, ...],
                    "inflight": int,                 # turns of the replica's own kind (the only
                                                     # kind it takes)
                    "capacity": int,                 # configured max_inflight
                    "effective_capacity": int,       # after engine load (engine_load policy)
                    "batch_capacity": int | None,    # the engine's, learned from its probes
                                                     # (None: no queue seen since it was healthy)
                    "reserved_headroom": int,        # slots kept from batch turns
                    "leased": int,                   # slots leased to dataplanes, unused
                    "healthy": bool,                 # true until a probe says otherwise
                    "draining": bool,                # takes only runs pinned there (rule 16)
                    "removing": bool,                # takes nothing; leaves when nothing is placed
                    "breaker": "closed" | "open" | "half_open",   # its circuit breaker (rule 17)
                    "tripped": bool,                 # circuit breaker open: it takes no turn
                    "failures_in_a_row": int,        # engine-fault failures counted toward opening
                    "probed_s_ago": float | None,    # None before the first probe
                    "running": int | None, "waiting": int | None,   # engine-reported, None = no load
                    "kv_usage": float | None, "cache_hit_rate": float | None}, ...],
                                                                    # configuration order
      "held": {"count": int,                                        # generative and single-pass
               "by_kind": {"generative": int, "single_pass": int},
               "by_class": {"interactive": int, "batch": int},
               "by_caller": {caller: int, ...},                     # "" is the anonymous caller
               "oldest_wait_s": float,                              # 0.0 when nothing is held
               "oldest_wait_s_by_kind": {"generative": float, "single_pass": float},
               "oldest_wait_s_by_class": {"interactive": float, "batch": float},
               "oldest_wait_s_by_caller": {caller: float, ...}},
      "runs": {"idle": int, "generating": int, "tool_paused": int},   # single-pass turns have none
      "runs_by_class": {"interactive": int, "batch": int},
      "runs_by_caller": {caller: int, ...},                           # callers with runs only
      "inflight_by_caller": {caller: int, ...},    # placed generative turns; callers with any only
      "inflight_by_root": {root: int, ...},        # the same summed per root caller (the part
                                                   # before the first "/"), what fairness ranks first
      "counters": {"arrived": int, "admitted": int, "adopted": int, "finished": int, "failed": int,
                   "rejected": int, "abandoned": int, "abandoned_held": int,
                   "abandoned_placed": int, "held_adopted": int, "expired_turns": int,
                   "expired_runs": int, "runs_ended": int, "turns_released_resync": int,
                   "turns_released_lost_dataplane": int,
                   "leased": int, "lease_crossings": int, "leased_off_affinity": int,
                   "lease_revocations": int,        # leases: rule 14 of decide
                   "limited_held": int, "limited_token_rate": int,   # refused by a limit (rule 18;
                   "held_timed_out": int,                            # parts of rejected / held fates)
                   "breaker_trips": int, "breaker_closes": int,
                   "replicas_added": int, "replicas_retired": int},
      "leases": {dataplane_id: {replica: int, ...}, ...},   # unused slots each lessee holds
                                                           # ({} for a lessee holding none)
      "lost_dataplanes": {dataplane_id: float, ...}   # seconds since its last Connect stream ended,
                                                      # until it returns or its turns are released
      "startup_hold_s": float,   # seconds the startup hold (rule 15) still holds turns; 0.0: none
      "limits": {"on": bool,                       # any held, timeout or rate limit configured
                 "breaker_failures": int,          # 0: no circuit breaker
                 "breaker_transitions": [[replica, from, to, int], ...],   # times each happened
                 "refused": {"held": int, "queue_timeout": int, "token_rate": int},
                 "refused_by_class": {class: {"held" | "queue_timeout" | "token_rate": int}},
                 "refused_by_caller": {caller: int, ...},   # at most 1,000 callers, then "*"
                 "token_buckets": {holder: {class: float}}},  # tokens left, buckets not full only;
                                                   # by the name holding the limit (its root, or a
                                                   # configured caller above or at the turn's)
    }

Every ``oldest_wait_s*`` is 0.0 where nothing of that kind, class or caller is held. The counters
count turns of both kinds. It walks every held turn and run once: a status call, not a per-event
cost.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from luftpause.scheduler.core.events import RUN_PHASES, SERVICE_CLASSES
from luftpause.scheduler.core.policies import engine_load, headroom
from luftpause.scheduler.core.state import State

REPLICA_KINDS = ("generative", "single_pass")


def snapshot(state: State, now: float) -> dict[str, Any]:
    """The state at ``now`` (the shell's monotonic seconds) in the shape above. Reads only."""
    by_kind = dict.fromkeys(REPLICA_KINDS, 0)
    by_class = dict.fromkeys(SERVICE_CLASSES, 0)
    by_caller: dict[str, int] = {}
    wait_by_kind = dict.fromkeys(REPLICA_KINDS, 0.0)
    wait_by_class = dict.fromkeys(SERVICE_CLASSES, 0.0)
    wait_by_caller: dict[str, float] = {}
    for turn in state.held:  # arrival order: the first seen of each is its oldest
        wait = max(0.0, now - turn.arrived_at)
        kind = "single_pass" if turn.single_pass else "generative"
        if not by_kind[kind]:
            wait_by_kind[kind] = wait
        if not by_class.get(turn.service_class):
            wait_by_class[turn.service_class] = wait
        if turn.caller not in by_caller:
            wait_by_caller[turn.caller] = wait
        by_kind[kind] += 1
        by_class[turn.service_class] = by_class.get(turn.service_class, 0) + 1
        by_caller[turn.caller] = by_caller.get(turn.caller, 0) + 1
    oldest = state.held.oldest()
    runs = dict.fromkeys(RUN_PHASES, 0)
    runs_by_class = dict.fromkeys(SERVICE_CLASSES, 0)
    runs_by_caller: dict[str, int] = {}
    for run in state.runs.values():
        runs[run.phase] = runs.get(run.phase, 0) + 1
        runs_by_class[run.service_class] = runs_by_class.get(run.service_class, 0) + 1
        runs_by_caller[run.caller] = runs_by_caller.get(run.caller, 0) + 1
    return {
        "replicas": [
            {
                "name": replica.name,
                "kind": replica.kind,
                "models": list(replica.models),
                "inflight": replica.inflight,
                "capacity": replica.max_inflight,
                "effective_capacity": engine_load.capacity(replica),
                "batch_capacity": replica.batch_capacity,
                "reserved_headroom": headroom.reserved(replica),
                "leased": replica.leased,
                "healthy": replica.healthy,
                "draining": replica.draining,
                "removing": replica.removing,
                "breaker": replica.breaker,
                "tripped": replica.tripped,
                "failures_in_a_row": replica.failures,
                "probed_s_ago": None if replica.probed_at is None else max(0.0, now - replica.probed_at),
                "running": replica.engine_running,
                "waiting": replica.engine_waiting,
                "kv_usage": replica.kv_usage,
                "cache_hit_rate": replica.cache_hit_rate,
            }
            for replica in state.replicas.values()
        ],
        "held": {
            "count": len(state.held),
            "by_kind": by_kind,
            "by_class": by_class,
            "by_caller": by_caller,
            "oldest_wait_s": max(0.0, now - oldest.arrived_at) if oldest is not None else 0.0,
            "oldest_wait_s_by_kind": wait_by_kind,
            "oldest_wait_s_by_class": wait_by_class,
            "oldest_wait_s_by_caller": wait_by_caller,
        },
        "runs": runs,
        "runs_by_class": runs_by_class,
        "runs_by_caller": runs_by_caller,
        "inflight_by_caller": dict(state.caller_inflight),
        "inflight_by_root": dict(state.root_inflight),
        "counters": asdict(state.counters),
        "leases": {
            dataplane_id: {name: holding.count for name, holding in holdings.items() if holding.count}
            for dataplane_id, holdings in state.lessees.items()
        },
        "lost_dataplanes": {
            dataplane_id: max(0.0, now - lost_at) for dataplane_id, lost_at in state.lost_dataplanes.items()
        },
        "startup_hold_s": (
            max(0.0, state.hold_until - now) if state.holding and state.hold_until is not None else 0.0
        ),
        "limits": _limits(state, now),
    }


def _limits(state: State, now: float) -> dict[str, Any]:
    protection = state.protection
    buckets: dict[str, dict[str, float]] = {}
    for (holder, service_class), bucket in state.buckets.items():
        these = protection.of(holder, service_class)  # type: ignore[arg-type]
        level = min(these.burst, bucket.level + (these.tokens_per_s or 0.0) * max(0.0, now - bucket.at))
        buckets.setdefault(holder, {})[service_class] = round(level, 1)
    c = state.counters
    return {
        "on": protection.on,
        "breaker_failures": protection.breaker_failures,
        "breaker_transitions": [[*key, count] for key, count in sorted(state.breaker_transitions.items())],
        "refused": {
            "held": c.limited_held,
            "queue_timeout": c.held_timed_out,
            "token_rate": c.limited_token_rate,
        },
        "refused_by_class": {cls: dict(reasons) for cls, reasons in state.limited_by_class.items()},
        "refused_by_caller": dict(state.limited_by_caller),
        "token_buckets": buckets,
    }
