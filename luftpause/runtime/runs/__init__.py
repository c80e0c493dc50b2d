"""Runs: what one is asked, what it is, who owns it, and how it survives a restart.

Owns: spawn's one contract (:mod:`.spec`: ``SpawnArguments``, and ``RunSpec``, the journal's start
record), the run record (:mod:`.record`), the registry that owns every run's asyncio task and is
the only way a run changes (:mod:`.registry`; the changes themselves :mod:`.run_changes`, what it
keeps for each run held :mod:`.held`, the loop tasks :mod:`.loop_tasks`), the store its records go
to (:mod:`.store`: the journal ``runs.jsonl``, :mod:`.journal`, or PostgreSQL, :mod:`.postgres`,
with the leases of runtimes sharing it, :mod:`.custody`, followed while serving by
:mod:`.takeovers`) and their replay and compaction (:mod:`.replay`), budgets
over run trees (:mod:`.budgets`), which finished runs are kept (:mod:`.retention`), what
``await``/``status`` show (:mod:`.views`), waiting (:mod:`.waiting`) and the network's change
counter (:mod:`.changes`).

May import: :mod:`luftpause.runtime.errors` only. The parts that keep state beside the runs (pods)
reach the registry as its listeners (:mod:`.listeners`), given when it is built.
"""
