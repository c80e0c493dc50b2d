"""Filesystem scopes of runs (pods) and the ledger that delegates them (docs/architecture.md "Pods").

Pure: no IO, no clock. The built-in workspace tools (:mod:`luftpause.runtime.pods.workspace`) resolve
real paths and call :meth:`Scope.check` / :meth:`EffectiveScope.check`; the runtime keeps one
:class:`ScopeLedger` and journals the records it returns.

Rules of a scope
----------------

A :class:`Scope` is an ordered set of :class:`Rule`\\ s, each ``allow`` or ``deny`` for ``read``
and/or ``write`` on an absolute, normalized path. A rule *covers* a path on whole components:
``/ws/a`` covers ``/ws/a`` and ``/ws/a/b`` but not ``/ws/ab``; ``/`` covers everything.
Patterns are path prefixes only, no globs: prefixes keep subset and difference exact (below),
which globs would not without a glob-intersection algebra.

Deciding ``check(path, mode)``:

1. Of the rules that cover ``path`` and name ``mode``, the most specific wins: the one with the
   most path components.
2. At equal specificity ``deny`` beats ``allow``.
3. No rule covers it: denied (default deny).

So ``allow read,write /ws`` + ``deny write /ws/secret`` + ``allow write /ws/secret/drafts`` lets
``/ws/secret/drafts/x`` be written and ``/ws/secret/x`` only read. The order of rules never
changes a decision; it is kept only for display and round trips. (Claude Code's permission rules
let any deny beat any allow; most-specific-wins is what makes "give the child ``/ws/a`` out of my
``/ws``" expressible as one more rule, and Codex's ``writable_roots`` is the allow-only case.)

Exact set algebra: every scope's decision for a mode is constant on the *region* of each of its
rule paths ``q`` (the paths whose longest covering rule path is ``q``). So for any scopes
``S1..Sn``, evaluating each at every path in the union of their rule paths decides them everywhere;
:func:`is_within` checks exactly that, no sampling.

The ledger
----------

A :class:`ScopeLedger` holds live *holders* (run handles, or a principal the runtime names, such as
its configured workspace), each with the scope it was *granted* and its parent (the nearest live
holder it came from; ``None`` for a root). Its *effective* scope (:class:`EffectiveScope`) is the
grant, minus, for writing only, whatever its live children were granted::

    effective(R).read(p)  = granted(R).read(p)
    effective(R).write(p) = granted(R).write(p) and no live child C of R has granted(C).write(p)

* ``grant(h, scope, parent=P)``: ``scope`` must be within ``effective(P)`` (read and write), else
  :class:`ScopeExceeded` naming what exceeds. A root (``parent=None``) is a child of an implicit
  top holding ``allow read,write /``, so live roots never share a writable path either.
  Consequence: two siblings can never both be granted write on one path, and at most one live
  holder can write any path.
* ``end(h)``: ``h`` leaves the ledger. What it held for writing returns to its parent (nothing to
  do: the parent's effective scope is computed from its live children). Its live children are
  re-parented to its parent and keep what they hold; when they end, it returns to that parent.
  The chain A → B → D with B ending first: D keeps its part (A still cannot write it); when D
  ends, it returns to A. A root's live children become roots.
* ``grant(h, scope, parent=P, adopt=[D...])``: as ``grant``, and the live holders ``D`` (children
  of ``P``, each within ``scope``) become ``h``'s children, keeping what they hold. A run that went
  idle and is re-opened takes back its scope this way while a descendant it delegated to still
  holds a part: the part is withheld from it only while that descendant lives, and returns to it
  when the descendant ends (rather than staying denied to it for good).

Journal records (camelCase, as in ``runs.jsonl``; the types do not collide with the journal's run
records)::

    {"type": "scopeGrant", "handle", "parent": handle | null, "name": str | null,
     "scope": [rule json], "grantedBy"?: handle | null, "adopt"?: [handle]}
    {"type": "scopeEnd", "handle"}

(``grantedBy``, only in a compacted grant, is the parent it was first granted from when that one
has ended since: the holder is then named ``'d' (a descendant)`` rather than ``child 'd'``.)
    rule json = {"effect": "allow" | "deny", "access": ["read"?, "write"?], "path": "/abs"}

:meth:`ScopeLedger.grant` and :meth:`ScopeLedger.end` return the record to append;
:meth:`ScopeLedger.apply` replays one; :meth:`ScopeLedger.to_records` gives a compact set (one
grant per live holder, parents first) that replays to the same ledger.

Errors (defined in :mod:`luftpause.runtime.errors`, whose tree they hang from): ``BadScope``
(400) for a rule that is not a rule (relative path, unknown access or effect), ``ScopeExceeded``
(400) "scope exceeds the spawner's: write /etc", ``ScopeDenied`` (403) "write /ws/x denied by
rule deny write /ws (held by child 'b')", ``UnknownRun`` (404) when the ledger holds no such
handle.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from luftpause.runtime.errors import BadScope, ScopeDenied, ScopeExceeded, UnknownRun

Mode = Literal["read", "write"]
Effect = Literal["allow", "deny"]
Record = dict[str, Any]

MODES: tuple[Mode, ...] = ("read", "write")
GRANT = "scopeGrant"
END = "scopeEnd"
"""The ``type`` of every record :meth:`ScopeLedger.apply` accepts."""

# The wire shape of rules and scopes (RULE_SCHEMA, SCOPE_SCHEMA) is part of spawn's contract:
# luftpause.runtime.runs.spec. What they mean is here.


def normalize_path(path: str) -> str:
    """``path`` made canonical for rules and checks: absolute, no ``.``/``..``/``//``/trailing ``/``.

    Purely lexical (``/ws/link/..`` becomes ``/ws``): callers that touch the filesystem resolve
    real paths first (:func:`luftpause.runtime.pods.workspace.resolve`). Raises :class:`BadScope` for a
    relative or empty path, or one with a NUL byte.
    """
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise BadScope(f"expected an absolute path, got {path!r}")
    normal = posixpath.normpath(path)
    # POSIX normpath keeps a leading '//' (implementation-defined there); Linux treats it as '/'.
    return "/" + normal.lstrip("/")


def covers(prefix: str, path: str) -> bool:
    """Whether rule path ``prefix`` covers ``path`` on whole components (both normalized)."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


@dataclass(frozen=True, slots=True)
class Rule:
    """``effect`` (``allow``/``deny``) of the ``access`` modes on ``path`` and everything under it.

    Build with :meth:`make` (normalizes and validates); ``str(rule)`` is ``allow read,write /ws``.
    """

    effect: Effect
    access: frozenset[Mode]
    path: str

    @classmethod
    def make(cls, effect: str, access: Iterable[str] | str, path: str) -> Rule:
        """A validated rule; ``access`` is modes or a comma list (``"read,write"``). Raises
        :class:`BadScope`."""
        if effect not in ("allow", "deny"):
            raise BadScope(f"rule effect: expected 'allow' or 'deny', got {effect!r}")
        modes = access.split(",") if isinstance(access, str) else list(access)
        if not modes or any(m not in MODES for m in modes):
            raise BadScope(f"rule access: expected some of 'read', 'write', got {access!r}")
        return cls(effect, frozenset(modes), normalize_path(path))  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, value: Any) -> Rule:
        """From ``{"effect", "access": [...], "path"}`` (``runs.spec.RULE_SCHEMA``); raises
        :class:`BadScope`."""
        if not isinstance(value, Mapping) or set(value) != {"effect", "access", "path"}:
            raise BadScope(f"rule: expected {{'effect', 'access', 'path'}}, got {value!r}")
        access = value["access"]
        if not isinstance(access, list) or not all(isinstance(a, str) for a in access):
            raise BadScope(f"rule access: expected a list of 'read'/'write', got {access!r}")
        return cls.make(value["effect"], access, value["path"])

    def to_json(self) -> dict[str, Any]:
        return {"effect": self.effect, "access": [m for m in MODES if m in self.access], "path": self.path}

    def __str__(self) -> str:
        return f"{self.effect} {','.join(m for m in MODES if m in self.access)} {self.path}"


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to ``check(path, mode)``.

    ``rule`` is the rule that decided (``None``: no rule covers the path, denied by default);
    ``held_by`` names the child holding the path when the denial comes from delegation (then
    ``rule`` is ``deny write <the child's rule path>``). ``str()`` of a denial is the refusal text:
    ``write /ws/x denied by rule deny write /ws (held by child 'b')``.
    """

    allowed: bool
    path: str
    mode: Mode
    rule: Rule | None = None
    held_by: str | None = None
    held_text: str | None = None
    """``held by child 'b'`` or ``held by 'd' (a descendant)`` (:attr:`Holding.refusal`)."""

    def __str__(self) -> str:
        if self.allowed:
            return f"{self.mode} {self.path} allowed by rule {self.rule}"
        if self.rule is None:
            return f"{self.mode} {self.path} denied: no rule of the scope allows it"
        return f"{self.mode} {self.path} denied by rule {self.rule}{_held(self)}"

    def require(self, asked: str | None = None) -> None:
        """Raise :class:`ScopeDenied` if this is a denial (``asked``: the path before resolving)."""
        if not self.allowed:
            raise ScopeDenied(self, asked)


def _held(decision: Decision) -> str:
    if decision.held_by is None:
        return ""
    return f" ({decision.held_text or f'held by child {decision.held_by!r}'})"


class ScopeView(Protocol):
    """What :func:`is_within` needs: a decision per path and the rule paths
    whose regions decide it (see the module docstring)."""

    def check(self, path: str, mode: Mode) -> Decision: ...

    def rule_paths(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class Scope:
    """An ordered set of :class:`Rule` s (duplicates dropped, first position kept); decided as the
    module docstring says. Build with :meth:`of`, :meth:`from_json` or :func:`workspace_scope`."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def of(cls, *rules: Rule) -> Scope:
        return cls(tuple(dict.fromkeys(rules)))

    @classmethod
    def from_json(cls, value: Any) -> Scope:
        """From a list of rule objects (``runs.spec.SCOPE_SCHEMA``); raises :class:`BadScope`."""
        if not isinstance(value, list):
            raise BadScope(f"scope: expected a list of rules, got {value!r}")
        return cls.of(*(Rule.from_json(v) for v in value))

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.rules]

    def check(self, path: str, mode: Mode) -> Decision:
        """Decide ``mode`` on ``path`` (absolute; normalized lexically here). Raises
        :class:`BadScope` for a relative path."""
        path = normalize_path(path)
        best: Rule | None = None
        for rule in self.rules:
            if mode not in rule.access or not covers(rule.path, path):
                continue
            if (
                best is None
                or _depth(rule.path) > _depth(best.path)
                or (_depth(rule.path) == _depth(best.path) and rule.effect == "deny")
            ):
                best = rule
        return Decision(best is not None and best.effect == "allow", path, mode, best)

    def rule_paths(self) -> frozenset[str]:
        return frozenset(r.path for r in self.rules)

    def __str__(self) -> str:
        return "; ".join(map(str, self.rules)) or "(empty: nothing allowed)"


def workspace_scope(root: str) -> Scope:
    """``allow read,write <root>``: the scope of a configured workspace root (give it a real path:
    checks compare against real paths)."""
    return Scope.of(Rule.make("allow", ("read", "write"), root))


@dataclass(frozen=True, slots=True)
class Holding:
    """A live child's grant as seen from its parent: its writes are withheld from the parent."""

    handle: str
    name: str | None
    scope: Scope
    descendant: bool = False
    """Re-parented here when the child between ended: a grandchild (or deeper), not a child."""

    @property
    def label(self) -> str:
        return self.name if self.name is not None else self.handle

    @property
    def refusal(self) -> str:
        """How a denial names it: ``held by child 'b'``, or ``held by 'd' (a descendant)``."""
        if self.descendant:
            return f"held by {self.label!r} (a descendant)"
        return f"held by child {self.label!r}"


@dataclass(frozen=True, slots=True)
class EffectiveScope:
    """A holder's grant minus, for writing, what its live children hold (see the module docstring).

    ``check`` reports a path held by a child as ``deny write <child's deciding rule path>`` with
    ``held_by`` set to the child's name (its handle when unnamed).
    """

    granted: Scope
    held: tuple[Holding, ...] = ()

    def check(self, path: str, mode: Mode) -> Decision:
        decision = self.granted.check(path, mode)
        if not decision.allowed or mode != "write":
            return decision
        for holding in self.held:
            by_child = holding.scope.check(decision.path, "write")
            if by_child.allowed and by_child.rule is not None:
                withheld = Rule("deny", frozenset({"write"}), by_child.rule.path)
                return Decision(False, decision.path, mode, withheld, holding.label, holding.refusal)
        return decision

    def rule_paths(self) -> frozenset[str]:
        return self.granted.rule_paths().union(*(h.scope.rule_paths() for h in self.held))

    def to_json(self) -> dict[str, Any]:
        """``{"granted": [rule json], "heldByChildren": [{"handle", "name", "scope": [rule json]}]}``."""
        return {
            "granted": self.granted.to_json(),
            "heldByChildren": [
                {"handle": h.handle, "name": h.name, "scope": h.scope.to_json()} for h in self.held
            ],
        }


@dataclass(frozen=True, slots=True)
class ExcessItem:
    """``mode`` on the region of ``path`` is allowed by the child but not the parent (``denied``
    says by what)."""

    mode: Mode
    path: str
    denied: Decision

    def __str__(self) -> str:
        return f"{self.mode} {self.path}{_held(self.denied)}"


@dataclass(frozen=True, slots=True)
class Excess:
    """What a scope asks beyond another, path by path (sorted by path, then read before write)."""

    items: tuple[ExcessItem, ...]

    def __str__(self) -> str:
        return "; ".join(map(str, self.items))


def _regions(*scopes: ScopeView) -> list[str]:
    return sorted(frozenset().union(*(s.rule_paths() for s in scopes)))


def is_within(child: ScopeView, parent: ScopeView) -> Excess | None:
    """``None`` when everything ``child`` allows (read and write) ``parent`` allows too, else the
    :class:`Excess`. Exact (checks one path per region, module docstring)."""
    items = [
        ExcessItem(mode, path, parent_decision)
        for path in _regions(child, parent)
        for mode in MODES
        if child.check(path, mode).allowed and not (parent_decision := parent.check(path, mode)).allowed
    ]
    return Excess(tuple(items)) if items else None


TOP = Scope.of(Rule.make("allow", ("read", "write"), "/"))
"""What the roots of a ledger are carved from: everything."""


@dataclass(slots=True)
class _Entry:
    handle: str
    parent: str | None
    name: str | None
    scope: Scope
    children: list[str] = field(default_factory=list)
    granted_by: str | None = None
    """The parent it was granted from; ``parent`` differs once that one ended (re-parented)."""


def _grant_record(handle: str, scope: Scope, parent: str | None, name: str | None) -> Record:
    return {"type": GRANT, "handle": handle, "parent": parent, "name": name, "scope": scope.to_json()}


class ScopeLedger:
    """Live holders with their granted and effective scopes; delegation is exclusive for writing.

    Holders are run handles, or principals the runtime names (e.g. ``"workspace"`` granted
    :func:`workspace_scope` of the configured root as a root, MCP callers' runs granted from it).
    Every mutation returns the journal record that replays it (module docstring). Not thread-safe:
    the runtime calls it from its event loop.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._roots: list[str] = []

    def __contains__(self, handle: object) -> bool:
        return handle in self._entries

    def live(self) -> list[str]:
        """Live holders, parents before children (grant order among siblings)."""
        return [e.handle for e in self._walk()]

    def parent(self, handle: str) -> str | None:
        """The nearest live holder ``handle``'s scope returns to (``None``: a root)."""
        return self._entry(handle).parent

    def children(self, handle: str | None) -> list[str]:
        """Live holders whose parent is ``handle`` (``None``: the roots)."""
        return list(self._roots if handle is None else self._entry(handle).children)

    def granted(self, handle: str) -> Scope:
        return self._entry(handle).scope

    def name(self, handle: str) -> str | None:
        """The name ``handle`` was granted under (a run's pod name), if any."""
        return self._entry(handle).name

    def effective(self, handle: str | None) -> EffectiveScope:
        """``handle``'s grant minus its live children's writes; ``None``: the top that roots come
        from (everything minus the live roots)."""
        if handle is None:
            return EffectiveScope(TOP, self._holdings(self._roots))
        entry = self._entry(handle)
        return EffectiveScope(entry.scope, self._holdings(entry.children))

    def check(self, handle: str, path: str, mode: Mode) -> Decision:
        """``effective(handle).check(path, mode)``."""
        return self.effective(handle).check(path, mode)

    def grant(
        self,
        handle: str,
        scope: Scope,
        *,
        parent: str | None,
        name: str | None = None,
        adopt: Sequence[str] = (),
    ) -> Record:
        """Give ``handle`` ``scope`` carved from ``parent``'s effective scope (``None``: a root),
        and make the live holders ``adopt`` (children of ``parent``) its children: they keep what
        they hold, which returns to ``handle`` when they end.

        Returns the ``scopeGrant`` record. Raises :class:`ScopeExceeded` when ``scope`` is not
        within it, less what ``adopt`` hold (for a root: when it would write what a live root
        writes), :class:`UnknownRun` for an unknown ``parent``, :class:`BadScope` when ``handle``
        is already live, or a holder of ``adopt`` is not a child of ``parent`` or holds more than
        ``scope``.
        """
        if handle in self._entries:
            raise BadScope(f"{handle!r} already holds a scope")
        siblings = self._roots if parent is None else self._entry(parent).children
        for child in adopt:
            if child not in siblings:
                raise BadScope(f"{child!r} is not a live holder under {parent!r}, so it cannot be adopted")
            if (beyond := is_within(self._entries[child].scope, scope)) is not None:
                raise BadScope(f"{child!r} holds more than {handle!r} would: {beyond}")
        source = self.effective(parent)
        kept = tuple(h for h in source.held if h.handle not in adopt)
        excess = is_within(scope, EffectiveScope(source.granted, kept))
        if excess is not None:
            raise ScopeExceeded(excess)
        entry = _Entry(handle, parent, name, scope, granted_by=parent)
        self._entries[handle] = entry
        for child in adopt:
            siblings.remove(child)
            self._entries[child].parent = handle
            entry.children.append(child)
        siblings.append(handle)
        record = _grant_record(handle, scope, parent, name)
        if adopt:
            record["adopt"] = list(adopt)
        return record

    def end(self, handle: str) -> Record:
        """``handle`` leaves: its holdings return to its parent, except what its live children hold,
        which they keep (re-parented to its parent). Returns the ``scopeEnd`` record; raises
        :class:`UnknownRun` when ``handle`` holds nothing."""
        entry = self._entries.pop(self._entry(handle).handle)
        siblings = self._roots if entry.parent is None else self._entries[entry.parent].children
        at = siblings.index(handle)
        # The orphans take the ended holder's place, so live() stays parents-first.
        siblings[at : at + 1] = entry.children
        for child in entry.children:
            self._entries[child].parent = entry.parent
        return {"type": END, "handle": handle}

    def apply(self, record: Mapping[str, Any]) -> None:
        """Replay a record from :meth:`grant`, :meth:`end` or :meth:`to_records`. Raises what those
        raise, and :class:`BadScope` for a record of another type or shape."""
        kind = record.get("type")
        try:
            if kind == GRANT:
                self.grant(
                    record["handle"],
                    Scope.from_json(record["scope"]),
                    parent=record["parent"],
                    name=record.get("name"),
                    adopt=list(record.get("adopt") or ()),
                )
                if "grantedBy" in record:
                    self._entries[record["handle"]].granted_by = record["grantedBy"]
            elif kind == END:
                self.end(record["handle"])
            else:
                raise BadScope(f"not a scope record: type {kind!r}")
        except KeyError as missing:
            raise BadScope(f"scope record {kind!r} without {missing}") from None

    def to_records(self) -> list[Record]:
        """One ``scopeGrant`` per live holder, parents first, with its current parent: replayed into
        an empty ledger they give this one (for journal compaction)."""
        records = []
        for e in self._walk():
            record = _grant_record(e.handle, e.scope, e.parent, e.name)
            if e.granted_by != e.parent:  # re-parented: keep it told apart from a child
                record["grantedBy"] = e.granted_by
            records.append(record)
        return records

    def _entry(self, handle: str) -> _Entry:
        try:
            return self._entries[handle]
        except KeyError:
            raise UnknownRun(handle) from None

    def _holdings(self, handles: Sequence[str]) -> tuple[Holding, ...]:
        entries = [self._entries[h] for h in handles]
        return tuple(Holding(e.handle, e.name, e.scope, e.parent != e.granted_by) for e in entries)

    def _walk(self) -> Iterator[_Entry]:
        stack = list(reversed(self._roots))
        while stack:
            entry = self._entries[stack.pop()]
            yield entry
            stack.extend(reversed(entry.children))
