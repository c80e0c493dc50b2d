"""The dataplane: the OpenAI-compatible proxy every turn passes through (docs/architecture.md
"The dataplane"). Four groups, one folder each, and the object graph built in one place:

==============  ===================================================================================
``intake/``     what a request becomes before it is admitted: its checks (``checks``), access,
                class, caller and run (``turns``, ``run_identity``), the front doors' plans
                (``front_doors``)
``relay/``      one admitted turn's answer: the sans-IO machine (``machine``), the thin loop that
                drives it and reports (``loop``), the engine connections (``upstream/``), its spans
``link/``       the scheduler link: the ``Connect`` stream, leases (``admission``), the run table it
                resyncs (``runs``), a turn's admission and failover (``placement``)
``server/``     the ASGI application and its route table (``app``), the exchange with granian
                (``asgi``), the process command (``command``), metrics and usage, count_tokens
``wiring``      :func:`~luftpause.dataplane.wiring.build_dataplane`: every part made once, in
                dependency order, each given what it uses
==============  ===================================================================================

Beside them: ``turn`` (the turn's stages, shared by all four), ``errors`` (the exception tree and
the HTTP status of each), ``apis/`` (the front-door translators, pure), and the SSE scanner's
selector over ``_speedups/`` with its pure twin: ``sse`` (``_sse_py``). The ``tool_call_id -> run``
table, which the scheduler keeps too, is :mod:`luftpause.tool_calls`.
"""
