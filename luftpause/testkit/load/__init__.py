"""Load: own-loop agents through the proxy (:mod:`.agents`), sub-agents over MCP with the runtime
driving every run (:mod:`.subagents`), and the per-group summary of their runs
(:mod:`.agents_summary`). ``luftpause loadgen`` (:mod:`luftpause.testkit.commands.loadgen`) runs them.
"""
