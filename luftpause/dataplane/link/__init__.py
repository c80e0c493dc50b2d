"""The scheduler link: the one ``Connect`` stream to the scheduler and its capacity leases
(``admission``), a turn's admission and failover to another replica (``placement``), and the
replica set the scheduler sent (``replicas``). Above intake (the replica set plans the front
doors), below the relay; the run table every resync carries is ``luftpause.dataplane.runs``."""
