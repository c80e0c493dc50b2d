"""The runtime's MCP surface (the ``mcp`` SDK's ``MCPServer``, both protocol eras).

Owns: the server and its instructions (:mod:`.server`), the tools by group (:mod:`.spawn_tools`,
:mod:`.run_tools`, :mod:`.pod_tools`), their annotations and titles (:mod:`.annotations`), tool
signatures generated from spawn's contract (:mod:`.signatures`), who the caller is
(:mod:`.callers`), asking about approvals by elicitation (:mod:`.elicitation`), the Tasks extension
(:mod:`.tasks`).

May import: every part below it (:mod:`luftpause.runtime.errors`, ``runs``, ``pods``,
``dataplane``, ``agent``, ``decide``, ``spawn``). Nothing below imports it.
"""
