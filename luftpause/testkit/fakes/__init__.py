"""Stand-ins for what luftpause talks to, other than engines (:mod:`luftpause.testkit.engine`):
an MCP tool server over HTTP (:mod:`.fake_mcp`, ``luftpause fake-mcp``), one over stdio
(:mod:`.fake_mcp_stdio`) and an OTLP trace receiver over HTTP and gRPC (:mod:`.otlp_receiver`).
"""
