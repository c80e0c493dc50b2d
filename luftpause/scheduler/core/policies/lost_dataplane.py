"""Lost dataplanes: when one that has had no Connect stream for a while is taken as gone for good.

A dataplane frees what it held by resyncing under its id when it comes back (rule 10 of
:mod:`luftpause.scheduler.core.decide`). One that never comes back under that id (a Kubernetes pod
replaced under a new host name, a replica set scaled down) would leave its placed turns counted in
flight until the 600 s turn expiry. So once its last Connect stream ended (``DataplaneLost``) and
no ``Resynced`` (the first message of a new stream) came for ``grace`` seconds, its placed turns
are released. 60 s fits many reconnect attempts (the dataplane retries every 1 s)
and a process restart. Its held turns need nothing: their Admit calls died with its connection, and
each cancelled Admit was already a ``TurnAbandoned``.

Reads: the time the dataplane was lost and the grace (seconds of the shell's monotonic clock).
"""

from __future__ import annotations

DATAPLANE_GRACE_S = 60.0


def gone_for_good(lost_at: float, now: float, grace: float = DATAPLANE_GRACE_S) -> bool:
    """True when a dataplane lost at ``lost_at`` has stayed away ``grace`` seconds or more."""
    return now - lost_at >= grace
