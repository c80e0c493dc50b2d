"""The relay: one admitted turn's answer, from the engine's bytes to the client's.

``machine``: the answer as a state machine with no IO (bytes in; bytes to send, facts and a typed
outcome out), where every rule of an answer's end and every front door's translation of it live.
``loop``: the thin asyncio loop that sends a turn to its replica, drives the machine and reports
its facts (:class:`~luftpause.dataplane.relay.loop.Relay`). ``upstream``: the engine connections.
"""
