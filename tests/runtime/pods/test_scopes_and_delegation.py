"""Scopes and the delegation ledger (luftpause.runtime.pods.scope): the rules, subset, the A → B → D
chain, replay of journal records, and a Hypothesis state machine over grants and ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from luftpause.runtime.errors import UnknownRun
from luftpause.runtime.pods.scope import (
    BadScope,
    Mode,
    Rule,
    Scope,
    ScopeDenied,
    ScopeExceeded,
    ScopeLedger,
    covers,
    is_within,
    normalize_path,
    workspace_scope,
)


def allow(access: str, path: str) -> Rule:
    return Rule.make("allow", access, path)


def deny(access: str, path: str) -> Rule:
    return Rule.make("deny", access, path)


# --- paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/ws", "/ws"),
        ("/ws/", "/ws"),
        ("//ws//a/./b", "/ws/a/b"),
        ("/ws/a/../b", "/ws/b"),
        ("/../..", "/"),
        ("/", "/"),
    ],
)
def test_paths_are_normalized_lexically(raw: str, normal: str) -> None:
    assert normalize_path(raw) == normal


@pytest.mark.parametrize("raw", ["ws/a", "", "./a", "/ws/\0"])
def test_relative_or_odd_paths_are_refused(raw: str) -> None:
    with pytest.raises(BadScope, match="expected an absolute path"):
        normalize_path(raw)


@pytest.mark.parametrize(
    ("prefix", "path", "covered"),
    [
        ("/ws/a", "/ws/a", True),
        ("/ws/a", "/ws/a/b", True),
        ("/ws/a", "/ws/ab", False),
        ("/ws/a", "/ws", False),
        ("/", "/anything/at/all", True),
    ],
)
def test_rules_cover_whole_components(prefix: str, path: str, covered: bool) -> None:
    assert covers(prefix, path) is covered


# --- deciding ------------------------------------------------------------------------------------

LAYERED = Scope.of(
    allow("read,write", "/ws"),
    deny("write", "/ws/secret"),
    allow("write", "/ws/secret/drafts"),
    deny("read", "/ws/private"),
)


@pytest.mark.parametrize(
    ("path", "mode", "allowed", "deciding"),
    [
        ("/ws", "read", True, "allow read,write /ws"),
        ("/ws/x/y", "write", True, "allow read,write /ws"),
        ("/wsx", "read", False, None),  # a sibling name is not under /ws
        ("/etc/passwd", "read", False, None),  # default deny
        ("/ws/secret/x", "write", False, "deny write /ws/secret"),  # more specific deny
        ("/ws/secret/x", "read", True, "allow read,write /ws"),  # the deny names write only
        ("/ws/secret/drafts/x", "write", True, "allow write /ws/secret/drafts"),  # deeper allow
        ("/ws/private", "read", False, "deny read /ws/private"),
        ("/ws/private/a", "write", True, "allow read,write /ws"),
        ("/ws/a/../secret/x", "write", False, "deny write /ws/secret"),  # normalized first
    ],
)
def test_most_specific_rule_decides(path: str, mode: Mode, allowed: bool, deciding: str | None) -> None:
    decision = LAYERED.check(path, mode)
    assert decision.allowed is allowed
    assert (str(decision.rule) if decision.rule else None) == deciding


def test_deny_wins_a_tie_whatever_the_order() -> None:
    both = [allow("write", "/ws"), deny("write", "/ws")]
    for rules in (both, both[::-1]):
        decision = Scope.of(*rules).check("/ws/a", "write")
        assert not decision.allowed
        assert str(decision.rule) == "deny write /ws"


def test_a_denial_says_the_mode_the_path_and_the_rule() -> None:
    decision = LAYERED.check("/ws/secret/a", "write")
    assert str(decision) == "write /ws/secret/a denied by rule deny write /ws/secret"
    assert str(LAYERED.check("/etc", "read")) == "read /etc denied: no rule of the scope allows it"
    with pytest.raises(ScopeDenied, match="denied by rule deny write /ws/secret") as raised:
        decision.require()
    assert raised.value.status == 403
    LAYERED.check("/ws/a", "write").require()  # an allowed decision raises nothing


@pytest.mark.parametrize(
    "value",
    [
        {"effect": "permit", "access": ["read"], "path": "/ws"},
        {"effect": "allow", "access": ["execute"], "path": "/ws"},
        {"effect": "allow", "access": [], "path": "/ws"},
        {"effect": "allow", "access": "read", "path": "/ws"},
        {"effect": "allow", "access": ["read"], "path": "ws"},
        {"effect": "allow", "access": ["read"]},
        "allow read /ws",
    ],
)
def test_bad_rules_are_refused(value: Any) -> None:
    with pytest.raises(BadScope):
        Scope.from_json([value])


def test_scope_json_round_trips_and_drops_duplicates() -> None:
    assert Scope.from_json(LAYERED.to_json()) == LAYERED
    assert Scope.of(allow("read", "/a"), allow("read", "/a/")).rules == (allow("read", "/a"),)
    assert LAYERED.to_json()[0] == {"effect": "allow", "access": ["read", "write"], "path": "/ws"}


# --- subset ----------------------------------------------------------------------------------------

WS = workspace_scope("/ws")


@pytest.mark.parametrize(
    ("child", "parent", "excess"),
    [
        (Scope.of(allow("read,write", "/ws/a")), WS, None),
        (Scope.of(allow("write", "/etc")), WS, "write /etc"),
        (Scope.of(allow("read,write", "/")), WS, "read /; write /"),
        (Scope.of(allow("read,write", "/ws/a")), LAYERED, None),
        (Scope.of(allow("write", "/ws/secret")), LAYERED, "write /ws/secret"),
        # the child keeps away from the parent's denied part: within
        (Scope.of(allow("write", "/ws"), deny("write", "/ws/secret")), LAYERED, None),
        (Scope.of(allow("read", "/ws")), LAYERED, "read /ws/private"),
        (Scope.of(allow("write", "/ws/secret/drafts/x")), LAYERED, None),
        (Scope(), Scope(), None),
        (Scope.of(allow("read", "/ws/ab")), Scope.of(allow("read", "/ws/a")), "read /ws/ab"),
    ],
)
def test_is_within_lists_what_exceeds(child: Scope, parent: Scope, excess: str | None) -> None:
    found = is_within(child, parent)
    assert (str(found) if found else None) == excess


def writers(ledger: ScopeLedger, path: str) -> list[str]:
    return [h for h in ledger.live() if ledger.check(h, path, "write").allowed]


def replayed(records: list[dict[str, Any]]) -> ScopeLedger:
    ledger = ScopeLedger()
    for record in records:
        ledger.apply(record)
    return ledger


def same(a: ScopeLedger, b: ScopeLedger, paths: list[str]) -> None:
    assert a.live() == b.live()
    assert a.to_records() == b.to_records()
    for handle in a.live():
        assert a.parent(handle) == b.parent(handle)
        for path in paths:
            for mode in ("read", "write"):
                assert a.check(handle, path, mode) == b.check(handle, path, mode)


CHAIN_PATHS = ["/ws", "/ws/a", "/ws/a/d", "/ws/a/d/x", "/ws/a/e", "/ws/b", "/etc"]


def chain() -> tuple[ScopeLedger, list[dict[str, Any]]]:
    """A holds /ws, B got /ws/a from A, D got /ws/a/d from B."""
    ledger = ScopeLedger()
    journal = [
        ledger.grant("A", WS, parent=None, name="a"),
        ledger.grant("B", Scope.of(allow("read,write", "/ws/a")), parent="A", name="b"),
        ledger.grant("D", Scope.of(allow("read,write", "/ws/a/d")), parent="B", name="d"),
    ]
    return ledger, journal


def test_delegated_writes_are_denied_to_the_spawner_and_reads_stay_shared() -> None:
    ledger, _ = chain()
    decision = ledger.check("A", "/ws/a/x", "write")
    assert str(decision) == "write /ws/a/x denied by rule deny write /ws/a (held by child 'b')"
    assert ledger.check("A", "/ws/a/x", "read").allowed
    assert ledger.check("A", "/ws/b", "write").allowed
    assert str(ledger.check("B", "/ws/a/d/x", "write")) == (
        "write /ws/a/d/x denied by rule deny write /ws/a/d (held by child 'd')"
    )
    assert ledger.check("D", "/ws/a/d/x", "write").allowed
    assert writers(ledger, "/ws/a/d/x") == ["D"]
    assert writers(ledger, "/ws/a/e") == ["B"]
    assert writers(ledger, "/ws/b") == ["A"]
    assert ledger.effective("A").to_json()["heldByChildren"] == [
        {"handle": "B", "name": "b", "scope": [allow("read,write", "/ws/a").to_json()]}
    ]


def test_chain_with_the_middle_ending_first_keeps_the_grandchild_part_until_it_ends() -> None:
    ledger, journal = chain()
    journal.append(ledger.end("B"))
    assert ledger.live() == ["A", "D"]
    assert ledger.parent("D") == "A"
    # B's own part came back to A; D's part stays with D
    assert writers(ledger, "/ws/a/e") == ["A"]
    assert writers(ledger, "/ws/a/d/x") == ["D"]
    assert ledger.check("A", "/ws/a/d/x", "write").held_by == "d"
    # A cannot hand D's part to someone else while D lives
    # ... and says D is A's descendant, not its child, also after a compaction
    refusal = r"scope exceeds the spawner's: write /ws/a/d \(held by 'd' \(a descendant\)\)"
    with pytest.raises(ScopeExceeded, match=refusal):
        ledger.grant("E", Scope.of(allow("write", "/ws/a")), parent="A", name="e")
    compacted = ScopeLedger()
    for record in ledger.to_records():
        compacted.apply(record)
    assert "(held by 'd' (a descendant))" in str(compacted.check("A", "/ws/a/d/x", "write"))
    journal.append(ledger.end("D"))
    assert writers(ledger, "/ws/a/d/x") == ["A"]
    assert ledger.live() == ["A"]
    assert replayed(journal).to_records() == ledger.to_records()


def test_chain_with_the_grandchild_ending_first_returns_to_the_middle_then_the_top() -> None:
    ledger, _ = chain()
    ledger.end("D")
    assert writers(ledger, "/ws/a/d/x") == ["B"]
    ledger.end("B")
    assert writers(ledger, "/ws/a/d/x") == ["A"]


def test_siblings_cannot_both_get_write_to_one_path() -> None:
    ledger = ScopeLedger()
    ledger.grant("A", WS, parent=None)
    ledger.grant("B", Scope.of(allow("write", "/ws/a")), parent="A", name="b")
    with pytest.raises(ScopeExceeded, match=r"write /ws/a/x \(held by child 'b'\)"):
        ledger.grant("C", Scope.of(allow("write", "/ws/a/x")), parent="A", name="c")
    # reading what a sibling writes is fine, and so is writing elsewhere
    ledger.grant("C", Scope.of(allow("read", "/ws/a"), allow("write", "/ws/c")), parent="A", name="c")
    assert writers(ledger, "/ws/a/x") == ["B"]
    assert "C" in ledger and ledger.check("C", "/ws/a/x", "read").allowed


def test_a_spawn_exceeding_the_spawner_is_refused_with_what_exceeded() -> None:
    ledger = ScopeLedger()
    ledger.grant("A", WS, parent=None)
    with pytest.raises(ScopeExceeded) as raised:
        ledger.grant("B", Scope.of(allow("read,write", "/ws/a"), allow("write", "/etc")), parent="A")
    assert str(raised.value) == "scope exceeds the spawner's: write /etc"
    assert raised.value.status == 400
    assert [(i.mode, i.path) for i in raised.value.excess.items] == [("write", "/etc")]
    assert ledger.live() == ["A"]  # nothing granted


def test_a_child_may_keep_part_of_its_grant_from_itself() -> None:
    ledger = ScopeLedger()
    ledger.grant("A", WS, parent=None)
    ledger.grant("B", Scope.of(allow("write", "/ws/a"), deny("write", "/ws/a/keep")), parent="A")
    assert writers(ledger, "/ws/a/x") == ["B"]
    assert writers(ledger, "/ws/a/keep/x") == ["A"]


def test_roots_never_share_a_writable_path() -> None:
    ledger = ScopeLedger()
    ledger.grant("workspace", WS, parent=None)
    with pytest.raises(ScopeExceeded, match="write /ws/a"):
        ledger.grant("other", Scope.of(allow("write", "/ws/a")), parent=None)
    ledger.grant("other", Scope.of(allow("read", "/ws"), allow("write", "/srv")), parent=None)
    assert ledger.children(None) == ["workspace", "other"]


def test_ending_a_root_makes_its_children_roots() -> None:
    ledger, _ = chain()
    ledger.end("A")
    assert ledger.children(None) == ["B"]
    assert ledger.parent("B") is None
    assert writers(ledger, "/ws/a/x") == ["B"]
    assert writers(ledger, "/ws/b") == []


def test_unknown_and_repeated_handles_are_refused() -> None:
    ledger, _ = chain()
    with pytest.raises(UnknownRun):
        ledger.end("Z")
    with pytest.raises(UnknownRun):
        ledger.grant("Z", Scope(), parent="Y")
    with pytest.raises(BadScope, match="already holds"):
        ledger.grant("D", Scope(), parent="A")
    with pytest.raises(BadScope, match="not a scope record"):
        ledger.apply({"type": "end", "handle": "D"})
    with pytest.raises(BadScope, match="without 'scope'"):
        ledger.apply({"type": "scopeGrant", "handle": "Q", "parent": "A"})


@pytest.mark.parametrize("cut", range(6))
def test_replay_mid_chain_equals_the_live_ledger(cut: int) -> None:
    """Each prefix of a history (A → B → D, a sibling C, B ends, D ends) replays, from the records
    as appended and from the compacted records, to the ledger as it stood."""
    ledger = ScopeLedger()
    steps: list[Callable[[], dict[str, Any]]] = [
        lambda: ledger.grant("A", WS, parent=None, name="a"),
        lambda: ledger.grant("B", Scope.of(allow("read,write", "/ws/a")), parent="A", name="b"),
        lambda: ledger.grant("D", Scope.of(allow("read,write", "/ws/a/d")), parent="B", name="d"),
        lambda: ledger.grant("C", Scope.of(allow("write", "/ws/c")), parent="A", name="c"),
        lambda: ledger.end("B"),
        lambda: ledger.end("D"),
    ]
    journal = [step() for step in steps[: cut + 1]]
    from_journal = replayed(journal)
    from_compacted = replayed(ledger.to_records())
    same(from_journal, ledger, [*CHAIN_PATHS, "/ws/c/x"])
    same(from_compacted, ledger, [*CHAIN_PATHS, "/ws/c/x"])
    # and the restored ledger goes on as the live one would
    if "D" in ledger:
        for restored in (ledger, from_journal, from_compacted):
            restored.end("D")
        same(from_journal, ledger, CHAIN_PATHS)
        same(from_compacted, ledger, CHAIN_PATHS)


# --- random grant/end sequences ----------------------------------------------------------------

PATHS = ["/ws", "/ws/a", "/ws/a/x", "/ws/a/x/1", "/ws/a/y", "/ws/b", "/ws/b/z", "/ws/ab"]
PROBES = [*PATHS, "/ws/a/x/1/deep", "/ws/b/other", "/ws/c", "/etc"]
rules = st.builds(
    Rule.make,
    st.sampled_from(["allow", "allow", "deny"]),
    st.sampled_from(["read", "write", "read,write"]),
    st.sampled_from(PATHS),
)
scopes = st.lists(rules, min_size=1, max_size=3).map(lambda rs: Scope.of(*rs))


class LedgerMachine(RuleBasedStateMachine):
    """A root holds /ws; runs are granted random scopes under random live holders and end in random
    order. Invariant: every path writable at the start is writable by exactly one live holder (the
    root when it came back), nothing else is writable, and replay gives the same ledger."""

    runs = Bundle("runs")

    @initialize()
    def start(self) -> None:
        self.ledger = ScopeLedger()
        self.journal: list[dict[str, Any]] = [self.ledger.grant("root", WS, parent=None)]
        self.counter = 0

    def _grant(self, parent: str, scope: Scope) -> str | None:
        self.counter += 1
        handle = f"r{self.counter}"
        if is_within(scope, self.ledger.effective(parent)) is None:
            self.journal.append(self.ledger.grant(handle, scope, parent=parent, name=handle))
            return handle
        with pytest.raises(ScopeExceeded):
            self.ledger.grant(handle, scope, parent=parent)
        assert handle not in self.ledger
        return None

    @rule(target=runs, scope=scopes)
    def grant_from_root(self, scope: Scope) -> str | None:
        return self._grant("root", scope)

    @rule(target=runs, parent=runs, scope=scopes)
    def grant_from_run(self, parent: str | None, scope: Scope) -> str | None:
        if parent is None or parent not in self.ledger:
            return None
        return self._grant(parent, scope)

    @rule(handle=consumes(runs))
    def end(self, handle: str | None) -> None:
        if handle is not None and handle in self.ledger:
            self.journal.append(self.ledger.end(handle))

    @invariant()
    def one_writer_per_path(self) -> None:
        for path in PROBES:
            count = len(writers(self.ledger, path))
            assert count == (1 if WS.check(path, "write").allowed else 0), (path, self.ledger.to_records())

    @invariant()
    def reads_are_the_grants(self) -> None:
        for handle in self.ledger.live():
            for path in PROBES:
                assert (
                    self.ledger.check(handle, path, "read").allowed
                    == self.ledger.granted(handle).check(path, "read").allowed
                )

    @invariant()
    def replay_gives_the_same_ledger(self) -> None:
        same(replayed(self.journal), self.ledger, PROBES)
        same(replayed(self.ledger.to_records()), self.ledger, PROBES)


LedgerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_ledger_state_machine = LedgerMachine.TestCase
