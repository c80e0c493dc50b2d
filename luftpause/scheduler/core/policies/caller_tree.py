"""The caller tree: ``/`` separates a caller from its sub-callers.

``team-a/job-7`` is a sub-caller of ``team-a``; a caller's *root* is the part before its first
``/`` (``team-a``; the anonymous caller ``""`` is its own root, and so is the root of ``/x``); its
*lineage* is itself and every caller above it, most specific first (``team-a/job-7/step-2``,
``team-a/job-7``, ``team-a``). With caller keys a key's caller is the top of what its holder can
name (``x-luftpause-caller`` only narrows it, ``luftpause/auth/callers.py``), so a key holder that
spreads its turns over many sub-callers still speaks as one root; without keys the header is free
and the same rule holds for whatever it says.

Used by the ordering policy (:mod:`.ordering`: root callers share fairly with each other, their
sub-callers within them) and the protection limits (:mod:`.limits`: the most specific configured
name of a lineage holds the limits and the counts).

Reads: the caller string only (at most 128 bytes, the dataplane's cut).
"""

from __future__ import annotations

SEPARATOR = "/"


def root(caller: str) -> str:
    """The root of ``caller``: the part before its first ``/`` (all of it when it has none)."""
    return caller.partition(SEPARATOR)[0]


def lineage(caller: str) -> list[str]:
    """``caller`` and every caller above it, most specific first; the root last
    (``"a/b/c"`` -> ``["a/b/c", "a/b", "a"]``, ``"a"`` -> ``["a"]``)."""
    names = [caller]
    cut = caller.rfind(SEPARATOR)
    while cut >= 0:
        caller = caller[:cut]
        names.append(caller)
        cut = caller.rfind(SEPARATOR)
    return names


def parent(caller: str) -> str | None:
    """The caller just above ``caller`` (``"a/b/c"`` -> ``"a/b"``); ``None`` for a root."""
    cut = caller.rfind(SEPARATOR)
    return None if cut < 0 else caller[:cut]
