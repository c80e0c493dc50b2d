"""``luftpause top``: the runtime's run network in a terminal (:mod:`.view`: the command and the
live drawing), the tree fitted and the runs' words (:mod:`.network`), the columns and the plain
``--once`` frame (:mod:`.columns`), read from the runtime's monitor data (:mod:`.monitor_client`).
"""
