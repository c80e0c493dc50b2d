"""The dataplane: the OpenAI-compatible proxy every turn passes through (docs/architecture.md
"The dataplane"). Four groups, one folder each, in layers (each imports only the shared modules
and the groups above it in this table; ``tests/dataplane/test_dataplane_layers.py``), and the
object graph built in one place:

==============  ===================================================================================
``intake/``     what a request becomes before it is admitted: its checks (``checks``), access,
                class, caller and run (``turns``, ``run_identity``), the front doors' plans
                (``front_doors``)
``link/``       the scheduler link: the ``Connect`` stream, leases (``admission``), a turn's
                admission and failover (``placement``), the replica set (``replicas``)
``relay/``      one admitted turn's answer: the sans-IO machine (``machine``), the thin loop that
                drives it and reports (``loop``), the engine connections (``upstream/``), its spans
``server/``     the ASGI application and its route table (``app``), a turn's life raced against
                its client (``turns``), count_tokens
``wiring``      :func:`~luftpause.dataplane.wiring.build_dataplane`: every part made once, in
                dependency order, each given what it uses
``command``     ``luftpause dataplane``: serves what ``wiring`` built
==============  ===================================================================================

Beneath them, shared by all four: ``turn`` (the turn's stages), ``runs`` (the run table every
resync carries), ``asgi`` (one HTTP exchange as granian serves it), ``errors`` (the exception tree
and the HTTP status of each; ``EngineError``), ``observe/`` (metrics and usage), ``apis/`` (the
front-door translators, pure), and the SSE scanner's
selector over ``_speedups/`` with its pure twin: ``sse`` (``_sse_py``). The ``tool_call_id -> run``
table, which the scheduler keeps too, is :mod:`luftpause.tool_calls`.
"""
