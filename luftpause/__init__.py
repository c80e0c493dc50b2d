"""luftpause: run-aware admission control between agent harnesses and LLM inference engines.

Three processes (see docs/architecture.md "Processes"): :mod:`luftpause.scheduler` decides where
every turn runs, :mod:`luftpause.dataplane` is the OpenAI-compatible proxy on the hot path, and
:mod:`luftpause.runtime` is the MCP server that drives durable sub-agents. :mod:`luftpause.testkit`
ships the engine simulator, the fake MCP tool server and the load generator.
"""

__version__ = "0.1.0"
