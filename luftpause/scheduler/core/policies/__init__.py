"""Placement policies: small, pure functions, one module each, each naming the signals it reads.

* :mod:`.routing` - which replicas may serve a turn at all (model, replica kind);
* :mod:`.affinity` - whether a run is pinned to its last replica (run phase, last replica);
* :mod:`.capacity` - whether a replica has room (in-flight turns, ``max_inflight``);
* :mod:`.least_loaded` - which of the replicas with room takes a free turn (in-flight turns);
* :mod:`.ordering` - which held turn gets a freed slot first (arrival order);
* :mod:`.expiry` - when a placed turn or an idle run is given up (placement time, last activity);
* :mod:`.abandoned` - how long an abandoned turn id is remembered and how its Admit is refused.

A later scorer (engine load, headroom, caller fairness) is a new module here, composed in
:mod:`luftpause.scheduler.core.decide`.
"""
