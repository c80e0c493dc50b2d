"""``luftpause runtime``: the MCP server that drives durable sub-agents (docs/architecture.md
"The runtime").

Its parts, bottom up; each may import only the parts above it in this list (and
:mod:`luftpause.config`, :mod:`luftpause.observe.tracing`), which
``tests/runtime/test_runtime_layers.py`` checks::

    errors.py      every error of the runtime, with its HTTP status
    runs/          runs: what a run is asked (spawn's one contract), its record, the registry that
                   owns every run's task, the journal (and its manifest), replay, budgets,
                   retention, waiting, tenants (whose runs a request sees)
    pods/          scopes held by runs, notifications, tree limits, send/read/stop/list
    dataplane.py   the one client of the dataplane (turns, decide, run ends)
    agent/         the sub-agent loop, upstream MCP tool servers, tool arguments, the approval
                   gate, the run's spans
    decide.py      ``decide``: classification through the dataplane
    spawn/         the one spawn path, named instructions, a sub-agent's built-in tools
    mcp/           the MCP surface: the tools, their annotations, callers, elicitation, Tasks
    web/           the HTTP edge: bearer token or caller keys, ``/status``, the monitor page
    wiring.py      the object graph, built in dependency order, and its lifespan
    server.py      the ASGI app and ``luftpause runtime`` (granian)

The path of a sub-agent's own ``spawn``, as the imports show it: ``agent.loop`` calls the
built-in tools it was given (``spawn.builtin_tools``), which call ``spawn.spawner``, which adds the
run to ``runs.registry`` and starts it; the registry drives it with the loop's ``drive``, given
when it starts serving (``wiring``).
"""
