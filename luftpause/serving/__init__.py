"""What every luftpause HTTP listener shares: the listen address checked free before granian binds
it (:mod:`.ports`), slow clients cut off, connections bounded and stops bounded (:mod:`.listeners`),
and ``GET /livez`` / ``GET /readyz`` in one shape (:mod:`.health`).
"""
