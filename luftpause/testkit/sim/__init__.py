"""Floods in virtual time: closed-loop agents, arrangements and engine models on one clock.

No processes, no sockets, no real time: a discrete-event simulation (:mod:`.clock`) of the agents
of a load shape (:mod:`.workload`), the arrangement between them and the engines
(:mod:`.arrangements`: direct and SGLang's router; :mod:`.gateway`: SGLang Model Gateway;
:mod:`.thunderagent`: ThunderAgent's capacity scheduler; :mod:`.continuum`: Continuum's engines
behind the router; :mod:`.scheduler`: luftpause's real scheduler core) and one engine model per
replica (:mod:`.engines` over :mod:`luftpause.testkit.engine.model`). :func:`.flood.simulate` runs
one; :mod:`.shapes` reads a whole load shape from a TOML file; :mod:`.replay` re-runs a trace the
scheduler recorded under another arrangement.
"""
