"""Pods: runs that other runs and people direct (docs/architecture.md "Pods").

Owns: filesystem scopes, pure (:mod:`.scope`: rules and the delegation ledger) and wired to runs'
lives and the journal (:mod:`.scopes`), the workspace's root write grants shared by the
runtimes on one PostgreSQL store (:mod:`.shared_roots`); the built-in workspace file tools
(:mod:`.workspace`); notifications to spawners and what a run finds before its next turn
(:mod:`.notifications`); tree limits and pod names (:mod:`.tree`); who acts (:mod:`.actors`);
``send``/``read``/``stop``/``list`` and the monitor's views (:mod:`.operations`).

May import: :mod:`luftpause.runtime.errors`, :mod:`luftpause.runtime.runs`, :mod:`luftpause.config`.
Spawning is not here (:mod:`luftpause.runtime.spawn` uses these parts).
"""
