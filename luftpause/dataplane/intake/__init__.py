"""Request intake: what a ``/v1`` request becomes before it is admitted (its access, service class,
caller, run and the turn's first stage, :class:`~luftpause.dataplane.turn.Intake`). No IO but the
body the route read; errors are :mod:`luftpause.dataplane.errors` (400, 401, 403)."""
