"""Filesystem scopes held by runs: the scope ledger (:mod:`luftpause.runtime.pods.scope`) wired to
the runs' lives and journaled in ``runs.jsonl``.

With ``[runtime] workspace = DIR`` the ledger holds a principal ``workspace`` granted
``allow read,write <real DIR>``; an MCP caller's run is carved from it, so two live runs never
write one path. Without a workspace no run holds a scope, and ``spawn(scope=...)`` is refused
(:data:`NO_WORKSPACE`). ``spawn(scope=[rules])`` must be within the spawner's effective scope
(refused with what exceeds); rule paths may be relative to the workspace and are taken as real
paths. Without ``scope`` a run may *read* what its spawner's grant lets it read and writes
nothing (reads are shared, so this never conflicts); a spawner holding no scope gives none.

A run holds its scope only while it is running: when it ends in any way (answers, fails,
``stop``, ``cancel``, a budget, dropped from the registry) what it holds returns to its spawner,
and what it delegated onward stays with its live descendants (the ledger's re-parenting). An idle
run (answered or failed) that is sent more work gets the scope it returned granted again before
it goes on (``scopeReturned`` records what to give back), carved from its nearest ancestor that
holds a scope now (the workspace at the top: an idle spawner gave its own back), less what its
own live descendants still hold (they become its ledger children again: their parts return to
it when they end); if another run was given any of it meanwhile, the ``send`` is refused with what
is held by whom.

Journal records (besides the ledger's ``scopeGrant`` / ``scopeEnd``)::

    {"type": "scopeReturned", "handle", "scope": [rule json]}   what an idle run gave back

Replayed at start; a holder whose run is not running after the replay (a crash between the two
records) is ended then.

Upstream tools' declared path arguments (``[[mcp_servers]] path_arguments``) are checked against
the scope of a run before the call (:meth:`RunScopes.upstream_refusal`); a run that holds no scope
may not pass them at all.

On a store several runtimes share, the roots' write grants are exclusive across them too
(:mod:`luftpause.runtime.pods.shared_roots`): a root grant (a spawn's, or a ``send``'s re-grant
from the workspace) is checked against the other runtimes' and recorded in the store before it is
given, and its record goes when the root's scope ends.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from luftpause.config import Config
from luftpause.runtime.errors import BadScope, PodRefused, RuntimeFault, ScopeExceeded
from luftpause.runtime.pods.scope import (
    END,
    GRANT,
    EffectiveScope,
    Mode,
    Rule,
    Scope,
    ScopeLedger,
    is_within,
    normalize_path,
    workspace_scope,
)
from luftpause.runtime.pods.shared_roots import shared_roots, writes
from luftpause.runtime.pods.workspace import check_path_arguments, path_arguments
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.store import Record, RecordStore

WORKSPACE = "workspace"
"""The ledger principal holding the configured workspace; MCP callers' runs are carved from it."""

RETURNED = "scopeReturned"
"""Journal record ``{"type": "scopeReturned", "handle", "scope": [rule json]}``: what an idle run
gave back, re-granted when it is sent more work."""

NO_WORKSPACE = (
    "scope: no [runtime] workspace is configured, so there is no filesystem scope to hand out "
    "(set [runtime] workspace to the directory runs may work in)"
)
"""The refusal of a scope asked for when the configuration has no workspace."""

Lookup = Callable[[str], Run | None]
"""A held run by handle, or ``None`` (the registry's :meth:`find`)."""


@dataclass(frozen=True, slots=True)
class SpawnPlan:
    """What :meth:`RunScopes.plan` decided for a new run: the ledger holder its scope comes from
    and the scope to grant (``None``: the run holds none)."""

    ledger_parent: str | None
    scope: Scope | None
    claimed: str | None = None
    """The handle whose root grant was recorded in the shared store (:meth:`RunScopes.abandon`
    deletes it when the run is never made)."""


def read_only(scope: Scope) -> Scope:
    """The read part of ``scope``: its rules that name ``read``, for reading only."""
    return Scope.of(*(Rule(r.effect, frozenset({"read"}), r.path) for r in scope.rules if "read" in r.access))


def descends(run: Run, ancestor: str, lookup: Lookup) -> bool:
    """Whether ``run`` is below the run ``ancestor`` (by handle) in its tree, as far as the runs
    between are still held."""
    parent = run.parent
    seen: set[str] = set()
    while parent is not None and parent not in seen:
        if parent == ancestor:
            return True
        seen.add(parent)
        above = lookup(parent)
        parent = above.parent if above is not None else None
    return False


class RunScopes:
    """The ledger of the runs' filesystem scopes, journaled (module docstring); a run listener of
    the registry (:class:`~luftpause.runtime.runs.registry.RunListener`)."""

    record_types = frozenset({GRANT, END, RETURNED})

    def __init__(self, config: Config, journal: RecordStore | None, changes: NetworkChanges) -> None:
        runtime = config.runtime
        self.journal = journal
        self.changes = changes
        self.workspace = normalize_path(os.path.realpath(runtime.workspace)) if runtime.workspace else None
        self.ledger = ScopeLedger()
        if self.workspace is not None:
            self.ledger.grant(WORKSPACE, workspace_scope(self.workspace), parent=None)
        self.path_arguments: dict[str, dict[str, Mode]] = {}
        for server in config.mcp_servers:
            for tool, declared in path_arguments(server).items():
                self.path_arguments.setdefault(tool, declared)
        self.returned: dict[str, Scope] = {}
        """What each idle run gave back when it went idle, re-granted by a ``send`` (journaled)."""
        self.shared = shared_roots(journal) if self.workspace is not None else None
        """The root write grants of every runtime on a shared store; ``None`` on a store of one."""

    def _journal(self, record: Record) -> None:
        self.changes.bump()
        if self.journal is not None:
            self.journal.append(record)

    # --- the run listener ------------------------------------------------------------------------

    def replay(self, record: Record) -> None:
        kind = record.get("type")
        if kind not in self.record_types:
            return
        # What does not apply raises: the replay counts it as journal damage and names the run.
        if kind == RETURNED:
            self.returned[str(record["handle"])] = Scope.from_json(record["scope"])
            return
        self.ledger.apply(record)
        if kind == GRANT:
            self.returned.pop(str(record["handle"]), None)

    def replayed(self, runs: Mapping[str, Run]) -> None:
        """End the scope of every holder whose run is gone or not running (its ``scopeEnd`` was
        lost in a crash between the two records); an idle one's is kept to re-grant."""
        for handle in self.ledger.live():
            if handle == WORKSPACE:
                continue
            run = runs.get(handle)
            if run is None or run.done:
                self._give_back(handle, keep=run is not None and run.pod_state == "idle")
        self._publish(())

    def run_ended(self, run: Run) -> None:
        if run.pod_state == "stopped":
            self._give_back(run.handle, keep=False)
            self.returned.pop(run.handle, None)
        else:
            self._give_back(run.handle, keep=True)

    def run_dropped(self, handle: str) -> None:
        self._give_back(handle, keep=False)
        self.returned.pop(handle, None)

    def snapshot(self) -> Iterable[Record]:
        for record in self.ledger.to_records():
            if record["handle"] != WORKSPACE:
                yield record
        for handle, scope in self.returned.items():
            yield {"type": RETURNED, "handle": handle, "scope": scope.to_json()}

    def _give_back(self, handle: str, *, keep: bool) -> None:
        """End ``handle``'s grant (journaled); ``keep``: remember it to re-grant on a ``send``."""
        if handle not in self.ledger:
            return
        scope = self.ledger.granted(handle)
        root = self.ledger.parent(handle) == WORKSPACE
        self._journal(self.ledger.end(handle))
        if root:  # its row goes; its live children, roots now, hold their parts in their own rows
            self._publish((handle,))
        if keep:
            self.returned[handle] = scope
            self._journal({"type": RETURNED, "handle": handle, "scope": scope.to_json()})

    # --- spawning --------------------------------------------------------------------------------

    def _real_rules(self, scope_json: Any) -> Scope:
        if not isinstance(scope_json, list):
            raise BadScope(f"scope: expected a list of rules, got {scope_json!r}")
        rules = []
        for item in scope_json:
            if isinstance(item, Mapping) and isinstance(item.get("path"), str):
                path = item["path"]
                if not path.startswith("/") and self.workspace is not None:
                    path = os.path.join(self.workspace, path)
                if path.startswith("/"):
                    item = {**item, "path": os.path.realpath(path)}
            rules.append(item)
        return Scope.from_json(rules)

    def _publish(self, gone: Iterable[str]) -> None:
        """Bring this runtime's rows of the shared root grants to its live roots that write."""
        if self.shared is None:
            return
        roots = {
            holder: self.ledger.granted(holder)
            for holder in self.ledger.children(WORKSPACE)
            if writes(self.ledger.granted(holder))
        }
        self.shared.publish(roots, tuple(gone))

    def _claim(self, handle: str, scope: Scope) -> bool:
        """Record the root grant of ``scope`` to ``handle`` in the shared store, once no run of
        another runtime writes any of it; whether a record was made. Raises
        :class:`ScopeExceeded` or :class:`StoreUnusable`."""
        if self.shared is None or not writes(scope):
            return False
        # Only the other runtimes' roots are checked here: the ledger checks this runtime's own.
        workspace = EffectiveScope(self.ledger.granted(WORKSPACE))
        self.shared.claim(handle, scope, workspace, self.ledger.live())
        return True

    def abandon(self, plan: SpawnPlan) -> None:
        """Delete the shared record of ``plan``'s root grant: its run was never made."""
        if plan.claimed is not None and self.shared is not None:
            self.shared.release(plan.claimed)

    def plan(self, parent: Run | None, scope_json: Any, handle: str | None = None) -> SpawnPlan:
        """The scope of a new run under ``parent`` (``None``: an MCP caller's), before it exists:
        ``scope_json`` (rules) within the spawner's effective scope, or the read part of its grant
        when ``None``. A root grant that writes, on a shared store, is recorded there for the new
        run ``handle`` before this returns (:meth:`abandon` if the run is not made). Raises
        :class:`PodRefused`, :class:`BadScope`, :class:`ScopeExceeded` (also for a path a run of
        another runtime writes) or :class:`StoreUnusable`."""
        if parent is not None:
            ledger_parent: str | None = parent.handle if parent.handle in self.ledger else None
            if ledger_parent is None:
                if scope_json is not None:
                    raise PodRefused("scope: the spawner holds no scope, so it has none to hand on")
                return SpawnPlan(None, None)
        else:
            ledger_parent = WORKSPACE if self.workspace is not None else None
        if scope_json is None:
            if ledger_parent is None:
                return SpawnPlan(None, None)
            return SpawnPlan(ledger_parent, read_only(self.ledger.granted(ledger_parent)))
        if ledger_parent is None:
            # The ledger's root would be the whole filesystem: an MCP caller's runs get a scope
            # only within the configured workspace, never one they name themselves.
            raise PodRefused(NO_WORKSPACE)
        scope = self._real_rules(scope_json)
        excess = is_within(scope, self.ledger.effective(ledger_parent))
        if excess is not None:
            raise ScopeExceeded(excess)
        if ledger_parent == WORKSPACE and handle is not None and self._claim(handle, scope):
            return SpawnPlan(ledger_parent, scope, claimed=handle)
        return SpawnPlan(ledger_parent, scope)

    def grant(self, run: Run, plan: SpawnPlan) -> None:
        """Give the new ``run`` its planned scope (journaled)."""
        if plan.scope is not None:
            self._journal(self.ledger.grant(run.handle, plan.scope, parent=plan.ledger_parent, name=run.name))

    def regrant(self, run: Run, lookup: Lookup) -> None:
        """Before an idle ``run`` continues: give it back the scope it returned when it went
        idle, carved again from its spawner's effective scope. Raises :class:`PodRefused` with
        what is held by whom when that is not free any more (a sibling was given it meanwhile)."""
        scope = self.returned.get(run.handle)
        if scope is None or run.handle in self.ledger:
            return
        # Carved from the nearest ancestor holding a scope now; an idle spawner gave its own back,
        # so then from above it (the workspace at the top): the ledger still lets at most one live
        # run write any path, and what the run held was within what its ancestors held.
        source: str | None = WORKSPACE if self.workspace is not None else None
        ancestor = lookup(run.parent) if run.parent is not None else None
        while ancestor is not None:
            if ancestor.handle in self.ledger:
                source = ancestor.handle
                break
            ancestor = lookup(ancestor.parent) if ancestor.parent is not None else None
        # What its own live descendants hold (they kept it when it went idle) stays theirs while
        # they live: the topmost of them (now under the source) become its children again, so
        # their parts are withheld from it only until they end, and then return to it.
        if source is None:
            raise PodRefused(NO_WORKSPACE)  # a journal from a configuration that had one
        adopt = [
            holder for holder in self._descendant_holders(run, lookup) if self.ledger.parent(holder) == source
        ]
        try:
            record = self.ledger.grant(run.handle, scope, parent=source, name=run.name, adopt=adopt)
            if source == WORKSPACE:
                try:
                    self._claim(run.handle, scope)
                except BaseException:
                    self.ledger.end(run.handle)  # never journaled: the grant is undone here
                    raise
        except (ScopeExceeded, BadScope) as exc:
            detail = exc.excess if isinstance(exc, ScopeExceeded) else exc
            raise PodRefused(
                f"run {run.handle} cannot continue: the scope it held is not free now: {detail}"
            ) from None
        self._journal(record)
        del self.returned[run.handle]

    def _descendant_holders(self, run: Run, lookup: Lookup) -> list[str]:
        """The live ledger holders below ``run`` in its run tree."""
        out = []
        for holder in self.ledger.live():
            if holder == WORKSPACE:
                continue
            held = lookup(holder)
            if held is not None and descends(held, run.handle, lookup):
                out.append(holder)
        return out

    # --- what a run holds ------------------------------------------------------------------------

    def holds(self, run: Run) -> bool:
        return run.handle in self.ledger

    def effective(self, run: Run) -> EffectiveScope | None:
        """``run``'s effective scope now, or ``None`` when it holds none."""
        return self.ledger.effective(run.handle) if run.handle in self.ledger else None

    def stop_summary(self, run: Run, lookup: Lookup) -> dict[str, Any] | None:
        """What a stop of ``run`` gives back and what stays below it::

            {"returns": [rule json]   what it holds for writing and reading, less its live
                                      descendants' writes: back to its spawner,
             "to": handle | "workspace" | null,
             "when": "now" | "when its current turn ends" | "already: it went idle",
             "staysWith": [{"handle", "name", "scope": [rule json]}]}
                                      its live descendants keep their parts until they end

        ``None`` when it holds no scope and no descendant does."""
        below = [
            {
                "handle": holder,
                "name": self.ledger.name(holder),
                "scope": self.ledger.granted(holder).to_json(),
            }
            for holder in self._descendant_holders(run, lookup)
        ]
        if run.handle in self.ledger:
            effective = self.ledger.effective(run.handle)
            withheld = [
                Rule("deny", frozenset({"write"}), rule.path)
                for holding in effective.held
                for rule in holding.scope.rules
                if rule.effect == "allow" and "write" in rule.access
            ]
            returns = Scope.of(*effective.granted.rules, *withheld).to_json()
            parent = self.ledger.parent(run.handle)
            when = "now" if run.done else "when its current turn ends"
        elif run.handle in self.returned:
            returns, parent, when = self.returned[run.handle].to_json(), None, "already: it went idle"
        elif below:
            returns, parent, when = [], None, "already: it went idle"
        else:
            return None
        return {"returns": returns, "to": parent, "when": when, "staysWith": below}

    def upstream_refusal(self, run: Run, name: str, arguments: dict[str, Any]) -> str | None:
        """Check an upstream call's declared path arguments against ``run``'s scope: the refusal
        text, or ``None`` once each declared argument in ``arguments`` has been replaced, in
        place, by the real path that was checked (so the server gets exactly what was allowed;
        ``~`` and URIs are refused, :func:`~luftpause.runtime.pods.workspace.check_path_arguments`)."""
        declared = self.path_arguments.get(name)
        if not declared:
            return None
        if run.handle not in self.ledger:
            names = ", ".join(declared)
            return f"Error: {name} takes paths ({names}) and this run holds no filesystem scope"
        try:
            check = self.ledger.effective(run.handle).check
            arguments.update(check_path_arguments(check, declared, arguments, base=self.workspace))
        except RuntimeFault as exc:
            return f"Error: {exc}"
        return None
