"""The test kit, shipped with luftpause (as ``trio.testing`` is with trio).

* :mod:`luftpause.testkit.fake_engine`: an OpenAI-compatible engine simulator (``luftpause fake-engine``).
* :mod:`luftpause.testkit.fake_mcp`: an MCP tool server with ``lookup`` and ``deep_search``.
* :mod:`luftpause.testkit.loadgen`: spawns sub-agents over MCP and reports what happened.
* :mod:`luftpause.testkit.procs`: starts any of the above, or luftpause's own processes, on free
  loopback ports and waits until they answer.
"""
