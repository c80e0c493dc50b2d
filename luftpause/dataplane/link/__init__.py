"""The scheduler link: the one ``Connect`` stream to the scheduler and its capacity leases
(``admission``), the run table every resync carries (``runs``), and a turn's admission and
failover to another replica (``placement``)."""
