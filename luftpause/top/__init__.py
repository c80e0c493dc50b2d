"""``luftpause top``: the runtime's run network in a terminal (:mod:`.view`), read from the
runtime's monitor data (:mod:`.monitor_client`).
"""
