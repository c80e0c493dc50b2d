"""Placement policies: small, pure functions, one module each, each naming the signals it reads.

* :mod:`.routing` - which replicas may serve a turn at all (model, replica kind);
* :mod:`.health` - whether a replica may get turns at all (its last probe, breaker, removal);
* :mod:`.breaker` - a replica failing turns in a row leaves rotation until a healthy probe;
* :mod:`.draining` - a draining replica takes only its pinned runs, a removing one nothing;
* :mod:`.affinity` - whether a run is pinned to its last replica (run phase, last replica, health);
* :mod:`.idle_affinity` - how long an idle run's next turn waits for its last replica (its prefix
  there, a prefill miss's cost learned from its first turn, the time since its last turn);
* :mod:`.engine_load` - a replica's effective capacity (engine running / waiting, ``max_inflight``);
* :mod:`.headroom` - slots kept from batch turns for interactive runs paused on a tool there;
* :mod:`.pause_hold` - how long a paused run keeps its slot (a TTL learned from its pauses);
* :mod:`.capacity` - whether a replica has room for a turn of a class (the three above, in-flight);
* :mod:`.least_loaded` - which of the replicas with room takes a free turn (in-flight turns);
* :mod:`.caller_tree` - callers and their sub-callers (``team-a/job-7`` under ``team-a``): roots, lineages;
* :mod:`.ordering` - which held turn gets a freed slot first (class, root's in-flight, caller's
  in-flight, rank, arrival);
* :mod:`.run_order` - the rank: whose run goes first among a caller's turns (run start, by default);
* :mod:`.expiry` - when a placed turn or an idle run is given up (placement time, last activity);
* :mod:`.abandoned` - how long an abandoned turn id is remembered and how its Admit is refused;
* :mod:`.lost_dataplane` - when a dataplane without a Connect stream is gone for good (time of loss);
* :mod:`.leases` - which replicas may be leased and how many slots (health, queue, capacity, headroom);
* :mod:`.limits` - protection limits (opt-in): held turns, queue timeout, token rate per caller and
  class, held and counted by the most specific configured name of the caller tree, else the root.

A later scorer (KV usage, prefix cache hit rate, both recorded from probes already) is a new module
here, composed in :mod:`luftpause.scheduler.core.decide`.
"""
