"""The sub-agent: its loop of LLM turns and tool rounds, and what a tool call goes through.

Owns: the loop (:mod:`.loop`), the upstream MCP tool servers (:mod:`.upstream`), tool arguments
coerced and validated against a tool's schema (:mod:`.tool_arguments`; the schema's shape that a
refusal names, :mod:`.schema_shape`), tool calls written as text
(:mod:`.text_tool_calls`), the approval gate and its answers (:mod:`.approvals`), the run's spans
(:mod:`.spans`).

May import: :mod:`luftpause.runtime.errors`, :mod:`luftpause.runtime.runs`,
:mod:`luftpause.runtime.dataplane`, :mod:`luftpause.config`, :mod:`luftpause.observe.tracing`. What the loop
needs of pods and spawning (arrivals, built-in tools, path checks) it is given, through protocols.
"""
