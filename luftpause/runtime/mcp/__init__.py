"""The runtime's MCP surface (the ``mcp`` SDK's ``MCPServer``, both protocol eras).

Owns: the server and its instructions (:mod:`.server`), the tools by group (:mod:`.spawn_tools`,
:mod:`.run_tools`, :mod:`.pod_tools`), their annotations and titles (:mod:`.annotations`), tool
signatures generated from spawn's contract (:mod:`.signatures`), who the caller is
(:mod:`.callers`), asking about approvals by elicitation (:mod:`.elicitation`), the Tasks extension
(:mod:`.tasks`; its records, :mod:`.task_records`; its binding to the SDK, :mod:`.tasks_extension`),
forwarding calls about runs and tasks another runtime holds (:mod:`.routing`).

May import: every part below it (:mod:`luftpause.runtime.errors`, ``runs``, ``pods``,
``dataplane``, ``agent``, ``decide``, ``spawn``). Nothing below imports it.
"""
