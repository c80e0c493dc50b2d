"""How runs come to be: the one spawn path, and what a sub-agent may do to make more.

Owns: the spawner, which checks, records and starts every run whoever asks (:mod:`.spawner`); named
instructions (:mod:`.instructions`); a sub-agent's built-in tools, workspace and orchestration
(:mod:`.builtin_tools`).

May import: :mod:`luftpause.runtime.errors`, :mod:`luftpause.runtime.runs`,
:mod:`luftpause.runtime.pods`, :mod:`luftpause.runtime.agent`.
"""
