"""Who acts on runs: an MCP caller, a sub-agent through its built-in tools, a person on the monitor.

Every pod operation (:mod:`luftpause.runtime.pods.operations`) and every spawn
(:mod:`luftpause.runtime.spawn.spawner`) is done by an :class:`Actor`. Its ``key`` is how events
and names are scoped: a run's handle, ``caller:<caller>`` for an MCP caller, ``person`` for the
monitor. A run's events go to its *spawner* (:func:`spawner_key`): its parent run, or the MCP
caller that spawned it.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.runtime.runs.record import Run, summarize
from luftpause.runtime.runs.tenants import Tenant

SUMMARY_CHARS = 200
"""Characters of a last answer's first line shown by ``list`` and the monitor."""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: ``key`` is how events and names are scoped (a run's handle, ``caller:<id>``, or
    ``person``), ``run`` the sub-agent when it is one (it may then act on its descendants only),
    ``label`` how the spawner is told who did it, ``caller`` the MCP caller it acts for,
    ``tenant`` whose runs it may see (``None``: no caller keys, all;
    :mod:`~luftpause.runtime.runs.tenants`)."""

    key: str
    label: str
    run: Run | None = None
    caller: str | None = None
    tenant: Tenant | None = None

    @classmethod
    def of_run(cls, run: Run) -> Actor:
        tenant = Tenant(run.spec.tenant) if run.spec.tenant is not None else None
        return cls(run.handle, f"run {run.name or run.handle}", run, run.caller, tenant)

    @classmethod
    def of_caller(cls, caller: str, tenant: Tenant | None = None) -> Actor:
        return cls(f"caller:{caller}", f"MCP caller {caller}", None, caller, tenant)

    @classmethod
    def person(cls, tenant: Tenant | None = None) -> Actor:
        """A person on the monitor, seeing ``tenant``'s runs (``None``: all)."""
        return cls("person", "a person (monitor)", tenant=tenant)


PERSON = Actor("person", "a person (monitor)")


def spawner_key(run: Run) -> str:
    """Where ``run``'s events go: its parent's handle, or its MCP caller."""
    return run.parent if run.parent is not None else f"caller:{run.caller}"


def one_line(text: str | None, limit: int = SUMMARY_CHARS) -> str | None:
    """The first line of ``text``, summarized to ``limit`` characters; ``None`` for no text."""
    if not text:
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    return summarize(first, limit)
