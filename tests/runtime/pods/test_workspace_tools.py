"""The built-in workspace tools (luftpause.runtime.pods.workspace) on real files under ``tmp_path``:
scope checks on real paths (``..``, symlinks), bounds, edit uniqueness, upstream path arguments."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from luftpause.runtime.pods import workspace
from luftpause.runtime.pods.scope import Rule, Scope, ScopeDenied, ScopeLedger, workspace_scope
from luftpause.runtime.pods.workspace import (
    TOOL_SCHEMAS,
    TOOLS,
    WorkspaceError,
    check_path_arguments,
    edit_file,
    list_directory,
    path_arguments,
    read_file,
    resolve,
    write_file,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``ws`` (the scope) and ``outside`` (a sibling with a secret) under a real tmp_path."""
    base = tmp_path.resolve()
    (base / "ws").mkdir()
    (base / "outside").mkdir()
    (base / "outside" / "secret.txt").write_text("top secret\n")
    return base


@pytest.fixture
def ws(root: Path) -> Path:
    return root / "ws"


@pytest.fixture
def scope(ws: Path) -> Scope:
    return workspace_scope(str(ws))


# --- resolving and refusing ----------------------------------------------------------------------


def test_dotdot_escapes_are_judged_where_they_point(scope: Scope, ws: Path, root: Path) -> None:
    asked = f"{ws}/sub/../../outside/secret.txt"
    with pytest.raises(ScopeDenied) as raised:
        read_file(scope.check, {"path": asked})
    real = root / "outside" / "secret.txt"
    assert str(raised.value) == f"read {real} denied: no rule of the scope allows it (asked for {asked})"
    with pytest.raises(ScopeDenied):
        read_file(scope.check, {"path": "../outside/secret.txt"}, base=str(ws))
    with pytest.raises(ScopeDenied):
        write_file(scope.check, {"path": f"{ws}/../outside/new.txt", "content": "x"})
    assert not (root / "outside" / "new.txt").exists()


def test_a_symlink_inside_the_scope_pointing_outside_is_refused(scope: Scope, ws: Path, root: Path) -> None:
    (ws / "link.txt").symlink_to(root / "outside" / "secret.txt")
    for call, arguments in [
        (read_file, {"path": str(ws / "link.txt")}),
        (write_file, {"path": str(ws / "link.txt"), "content": "overwritten"}),
        (edit_file, {"path": str(ws / "link.txt"), "old": "top", "new": "no"}),
    ]:
        with pytest.raises(ScopeDenied, match=f"{root}/outside/secret.txt denied.*asked for {ws}/link.txt"):
            call(scope.check, arguments)
    assert (root / "outside" / "secret.txt").read_text() == "top secret\n"


def test_a_path_whose_parent_is_a_symlink_outside_is_refused(scope: Scope, ws: Path, root: Path) -> None:
    (ws / "door").symlink_to(root / "outside", target_is_directory=True)
    with pytest.raises(ScopeDenied, match=f"write {root}/outside/planted.txt denied"):
        write_file(scope.check, {"path": str(ws / "door" / "planted.txt"), "content": "x"})
    with pytest.raises(ScopeDenied, match=f"read {root}/outside denied"):
        list_directory(scope.check, {"path": str(ws / "door")})
    assert sorted(os.listdir(root / "outside")) == ["secret.txt"]


def test_a_symlink_staying_inside_the_scope_is_followed(scope: Scope, ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "alias").symlink_to(ws / "real", target_is_directory=True)
    assert write_file(scope.check, {"path": str(ws / "alias" / "a.txt"), "content": "hi\n"}) == (
        f"wrote 3 bytes to {ws}/real/a.txt"
    )
    assert (ws / "real" / "a.txt").read_text() == "hi\n"


def test_relative_paths_need_a_base(scope: Scope, ws: Path) -> None:
    (ws / "a.txt").write_text("A\n")
    assert read_file(scope.check, {"path": "a.txt"}, base=str(ws)) == "A\n"
    with pytest.raises(WorkspaceError, match=r"expected an absolute path, got 'a\.txt'"):
        read_file(scope.check, {"path": "a.txt"})
    with pytest.raises(WorkspaceError, match="expected a path"):
        resolve(7)


def test_a_write_outside_the_scope_is_refused_with_the_rule(ws: Path) -> None:
    scope = Scope.of(
        Rule.make("allow", "read,write", str(ws)),
        Rule.make("deny", "write", str(ws / "locked")),
    )
    (ws / "locked").mkdir()
    with pytest.raises(ScopeDenied) as raised:
        write_file(scope.check, {"path": str(ws / "locked" / "x.txt"), "content": "x"})
    assert str(raised.value) == f"write {ws}/locked/x.txt denied by rule deny write {ws}/locked"
    assert raised.value.status == 403
    assert not (ws / "locked" / "x.txt").exists()


def test_a_write_into_a_child_held_path_names_the_child(ws: Path) -> None:
    ledger = ScopeLedger()
    ledger.grant("A", workspace_scope(str(ws)), parent=None)
    ledger.grant("B", workspace_scope(str(ws / "b")), parent="A", name="b")
    (ws / "b").mkdir()
    as_a = functools.partial(ledger.check, "A")
    with pytest.raises(ScopeDenied) as raised:
        write_file(as_a, {"path": str(ws / "b" / "x"), "content": "mine"})
    assert str(raised.value) == f"write {ws}/b/x denied by rule deny write {ws}/b (held by child 'b')"
    write_file(functools.partial(ledger.check, "B"), {"path": str(ws / "b" / "x"), "content": "mine"})
    assert read_file(as_a, {"path": str(ws / "b" / "x")}) == "mine"  # reads stay shared
    ledger.end("B")
    write_file(as_a, {"path": str(ws / "b" / "x"), "content": "back"})
    assert (ws / "b" / "x").read_text() == "back"


# --- read_file -------------------------------------------------------------------------------------


def test_read_whole_and_by_lines(scope: Scope, ws: Path) -> None:
    (ws / "f.txt").write_text("one\ntwo\nthree\nfour\n")
    check = scope.check
    assert read_file(check, {"path": str(ws / "f.txt")}) == "one\ntwo\nthree\nfour\n"
    assert read_file(check, {"path": str(ws / "f.txt"), "offset": 2, "limit": 2}) == (
        "two\nthree\n\n[stopped after 2 lines; read on with offset=4]"
    )
    assert read_file(check, {"path": str(ws / "f.txt"), "offset": 4, "limit": 2}) == "four\n"
    assert read_file(check, {"path": str(ws / "f.txt"), "offset": 9}) == (
        "\n[the file has 4 lines; offset 9 is past its end]"
    )
    (ws / "g.txt").write_text("one\nno newline at the end")
    assert read_file(check, {"path": str(ws / "g.txt"), "offset": 2}) == "no newline at the end"
    assert read_file(check, {"path": str(ws / "g.txt"), "offset": 4}) == (
        "\n[the file has 2 lines; offset 4 is past its end]"
    )


@pytest.mark.parametrize("bad", [0, -1, "2", True, 1.5])
def test_read_refuses_bad_offsets(scope: Scope, ws: Path, bad: Any) -> None:
    (ws / "f.txt").write_text("x\n")
    with pytest.raises(WorkspaceError, match="'offset': expected an integer of at least 1"):
        read_file(scope.check, {"path": str(ws / "f.txt"), "offset": bad})


def test_reads_are_bounded_and_say_how_to_read_on(
    scope: Scope, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace, "MAX_READ_BYTES", 10)
    (ws / "f.txt").write_text("abcd\nefgh\nijkl\n")
    assert read_file(scope.check, {"path": str(ws / "f.txt")}) == (
        "abcd\nefgh\n\n[cut at 10 bytes before line 3; read on with offset=3]"
    )
    assert read_file(scope.check, {"path": str(ws / "f.txt"), "offset": 3}) == "ijkl\n"
    (ws / "long.txt").write_text("x" * 25 + "\nnext\n")
    assert read_file(scope.check, {"path": str(ws / "long.txt")}) == (
        "xxxxxxxxxx\n[line 1 is longer than 10 bytes and is cut; the next line is offset=2]"
    )


def test_only_regular_files_are_read_and_a_fifo_never_blocks(scope: Scope, ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    with pytest.raises(WorkspaceError, match="pipe is not a regular file"):
        read_file(scope.check, {"path": str(ws / "pipe")})
    with pytest.raises(WorkspaceError, match="is not a regular file"):
        read_file(scope.check, {"path": str(ws)})
    with pytest.raises(WorkspaceError, match=r"cannot open .*/missing\.txt: No such file"):
        read_file(scope.check, {"path": str(ws / "missing.txt")})


# --- write_file ------------------------------------------------------------------------------------


def test_write_replaces_and_creates_parents(scope: Scope, ws: Path) -> None:
    (ws / "f.txt").write_text("a much longer old text\n")
    assert (
        write_file(scope.check, {"path": str(ws / "f.txt"), "content": "new\n"})
        == f"wrote 4 bytes to {ws}/f.txt"
    )
    assert (ws / "f.txt").read_text() == "new\n"
    write_file(scope.check, {"path": str(ws / "d1" / "d2" / "g.txt"), "content": "é"})
    assert (ws / "d1" / "d2" / "g.txt").read_bytes() == "é".encode()


def test_write_does_not_make_parents_it_may_not_write(ws: Path) -> None:
    only_file = Scope.of(Rule.make("allow", "write", str(ws / "new" / "f.txt")))
    with pytest.raises(ScopeDenied, match=f"write {ws}/new denied: no rule"):
        write_file(only_file.check, {"path": str(ws / "new" / "f.txt"), "content": "x"})
    assert not (ws / "new").exists()


def test_writes_are_bounded(scope: Scope, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_WRITE_BYTES", 4)
    with pytest.raises(WorkspaceError, match="content is 5 bytes; write_file writes at most 4"):
        write_file(scope.check, {"path": str(ws / "f.txt"), "content": "12345"})
    assert not (ws / "f.txt").exists()


# --- edit_file -------------------------------------------------------------------------------------


def test_edit_replaces_the_one_occurrence(scope: Scope, ws: Path) -> None:
    (ws / "f.py").write_text("a = 1\nb = 2\nc = 3\n")
    assert edit_file(scope.check, {"path": str(ws / "f.py"), "old": "b = 2", "new": "b = 20"}) == (
        f"edited {ws}/f.py: replaced the text at line 2"
    )
    assert (ws / "f.py").read_text() == "a = 1\nb = 20\nc = 3\n"
    edit_file(scope.check, {"path": str(ws / "f.py"), "old": "a = 1\nb = 20\nc = 3\n", "new": ""})
    assert (ws / "f.py").read_text() == ""


@pytest.mark.parametrize(
    ("text", "old", "new", "refusal"),
    [
        ("x = 1\n", "y = 1", "z", "old text not found in "),
        ("x = 1\ny = 2\nx = 1\n", "x = 1", "x = 2", r"occurs 2 times in .* \(at lines 1, 3\): give more"),
        ("aaa", "aa", "b", r"occurs 2 times in .* \(at lines 1, 1\)"),  # overlapping counts
        ("x", "", "y", "old is empty"),
        ("x", "x", "x", "old and new are the same text"),
    ],
)
def test_edit_refuses_missing_or_ambiguous_text(
    scope: Scope, ws: Path, text: str, old: str, new: str, refusal: str
) -> None:
    (ws / "f.txt").write_text(text)
    with pytest.raises(WorkspaceError, match=refusal):
        edit_file(scope.check, {"path": str(ws / "f.txt"), "old": old, "new": new})
    assert (ws / "f.txt").read_text() == text


def test_edit_needs_write_as_well_as_read(ws: Path) -> None:
    read_only = Scope.of(Rule.make("allow", "read", str(ws)))
    (ws / "f.txt").write_text("x\n")
    with pytest.raises(ScopeDenied, match=f"write {ws}/f.txt denied: no rule"):
        edit_file(read_only.check, {"path": str(ws / "f.txt"), "old": "x", "new": "y"})
    assert (ws / "f.txt").read_text() == "x\n"


def test_edit_refuses_files_that_are_not_utf8(scope: Scope, ws: Path) -> None:
    (ws / "bin").write_bytes(b"ok \xff\xfe")
    with pytest.raises(WorkspaceError, match="is not UTF-8 text"):
        edit_file(scope.check, {"path": str(ws / "bin"), "old": "ok", "new": "no"})


# --- list_directory --------------------------------------------------------------------------------


def test_list_shows_kinds_and_leaves_out_unreadable_entries(ws: Path, root: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "a.txt").write_text("abc")
    (ws / "out").symlink_to(root / "outside", target_is_directory=True)
    (ws / "hidden").mkdir()
    scope = Scope.of(Rule.make("allow", "read", str(ws)), Rule.make("deny", "read", str(ws / "hidden")))
    assert list_directory(scope.check, {"path": str(ws)}) == "\n".join(
        [
            f"{ws}:",
            "a.txt  (3 bytes)",
            f"out -> {root}/outside",
            "sub/",
            "[1 entries left out: outside the readable scope]",
        ]
    )
    with pytest.raises(ScopeDenied, match=f"read {ws}/hidden denied by rule deny read {ws}/hidden"):
        list_directory(scope.check, {"path": str(ws / "hidden")})


def test_list_is_bounded(scope: Scope, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_LIST_ENTRIES", 2)
    for name in "abc":
        (ws / name).write_text("")
    lines = list_directory(scope.check, {"path": str(ws)}).splitlines()[1:]
    assert len(lines) == 3 and all(line.endswith("  (0 bytes)") for line in lines[:2])
    assert lines[2] == "[and 1 more readable entries not shown: 2 shown, the first in directory order]"


def test_list_counts_unreadable_entries_apart_from_the_more_count(ws: Path, root: Path) -> None:
    partial_scope = Scope.of(
        Rule.make("allow", "read", str(ws)),
        Rule.make("deny", "read", str(ws / "h1")),
        Rule.make("deny", "read", str(ws / "h2")),
    )
    for name in ("a", "h1", "h2"):
        (ws / name).write_text("")
    lines = list_directory(partial_scope.check, {"path": str(ws)}).splitlines()[1:]
    assert lines == ["a  (0 bytes)", "[2 entries left out: outside the readable scope]"]


def test_list_shows_names_that_are_not_utf8_escaped(scope: Scope, ws: Path) -> None:
    os.close(os.open(os.fsencode(ws) + b"/caf\xe9.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    listing = list_directory(scope.check, {"path": str(ws)})
    assert "caf\\xe9.txt  (0 bytes)" in listing
    listing.encode("utf-8")  # the whole text is UTF-8: no lone surrogate left in it


# --- schemas and upstream path arguments --------------------------------------------------------


def test_tool_schemas_match_the_tools_and_are_json_schema() -> None:
    assert [t["name"] for t in TOOL_SCHEMAS] == list(TOOLS)
    for tool in TOOL_SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(tool["inputSchema"])
        assert set(tool) == {"name", "description", "inputSchema", "annotations"}
    edit = next(t for t in TOOL_SCHEMAS if t["name"] == "edit_file")["inputSchema"]
    jsonschema.validate({"path": "/ws/f", "old": "a", "new": "b"}, edit)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"path": "/ws/f", "old": "a"}, edit)


def test_path_arguments_read_both_config_shapes() -> None:
    server = SimpleNamespace(
        path_arguments={"write_note": ["path"], "search": {"root": "read", "out": "write"}}
    )
    assert path_arguments(server) == {
        "write_note": {"path": "write"},
        "search": {"root": "read", "out": "write"},
    }
    assert path_arguments(None) == {}
    assert path_arguments(object()) == {}  # a server config without the field
    with pytest.raises(ValueError, match=r"path_arguments.t: expected a list"):
        path_arguments({"t": "path"})
    with pytest.raises(
        ValueError, match=re.escape("expected argument = 'read' | 'write', got 'path' = 'execute'")
    ):
        path_arguments({"t": {"path": "execute"}})


def test_declared_path_arguments_are_checked(scope: Scope, ws: Path, root: Path) -> None:
    declared = path_arguments({"write_note": ["path", "also"]})["write_note"]
    check_path_arguments(scope.check, declared, {"path": str(ws / "n.txt"), "other": "/etc/passwd"})
    check_path_arguments(scope.check, declared, {"path": str(ws / "n.txt"), "also": None})
    with pytest.raises(ScopeDenied, match=f"write {root}/outside/n.txt denied"):
        check_path_arguments(
            scope.check, declared, {"path": str(ws / "n.txt"), "also": [str(root / "outside/n.txt")]}
        )
    (ws / "door").symlink_to(root / "outside", target_is_directory=True)
    with pytest.raises(ScopeDenied, match="asked for"):
        check_path_arguments(scope.check, declared, {"path": "door/n.txt"}, base=str(ws))
    with pytest.raises(WorkspaceError, match="argument 'path': expected a path or a list of paths"):
        check_path_arguments(scope.check, declared, {"path": 3})


def test_declared_path_arguments_give_the_real_paths_they_checked(scope: Scope, ws: Path) -> None:
    # What was checked is what goes upstream: a relative path or one through a symlink staying
    # inside the scope is sent as the real path, so the server cannot resolve it elsewhere.
    (ws / "sub").mkdir()
    (ws / "link").symlink_to(ws / "sub", target_is_directory=True)
    declared = path_arguments({"t": {"path": "write", "roots": "read"}})["t"]
    real = check_path_arguments(
        scope.check, declared, {"path": "link/../n.txt", "roots": ["link/a", str(ws)]}, base=str(ws)
    )
    assert real == {"path": f"{ws}/n.txt", "roots": [f"{ws}/sub/a", str(ws)]}


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("~/notes.txt", "'~' is not expanded"),
        ("~root/.ssh/authorized_keys", "'~' is not expanded"),
        ("file:///etc/passwd", "looks like a URI"),
        ("file:notes.txt", "looks like a URI"),
        ("s3://bucket/key", "looks like a URI"),
    ],
)
def test_declared_path_arguments_refuse_home_and_uris(scope: Scope, ws: Path, path: str, why: str) -> None:
    declared = path_arguments({"t": ["path"]})["t"]
    with pytest.raises(WorkspaceError, match=re.escape(why)):
        check_path_arguments(scope.check, declared, {"path": path}, base=str(ws))
    # a relative file whose name has a colon is written ./name
    assert check_path_arguments(scope.check, declared, {"path": "./a:b"}, base=str(ws)) == {
        "path": f"{ws}/a:b"
    }


# --- hard links, text, and failures leaving nothing behind ---------------------------------------


def test_hard_linked_files_are_neither_read_nor_written_through(scope: Scope, ws: Path, root: Path) -> None:
    secret = root / "outside" / "secret.txt"
    os.link(secret, ws / "innocent.txt")
    with pytest.raises(WorkspaceError, match="has 2 hard links"):
        write_file(scope.check, {"path": str(ws / "innocent.txt"), "content": "pwned"})
    with pytest.raises(WorkspaceError, match="has 2 hard links"):
        edit_file(scope.check, {"path": str(ws / "innocent.txt"), "old": "top", "new": "pwned"})
    assert secret.read_text() == "top secret\n"
    # A read of the name inside the scope is a read of the file outside it (issue 17, item 6).
    for arguments in ({"path": str(ws / "innocent.txt")}, {"path": "innocent.txt", "offset": 1, "limit": 1}):
        with pytest.raises(WorkspaceError, match=r"has 2 hard links: .* so it is not read") as raised:
            read_file(scope.check, arguments, base=str(ws))
        assert "top secret" not in str(raised.value)
    # The listing shows the name, not the size of the file it shares with the name outside.
    (ws / "plain.txt").write_text("plain\n")
    assert list_directory(scope.check, {"path": str(ws)}).splitlines()[1:] == [
        "innocent.txt  (2 hard links: not read)",
        "plain.txt  (6 bytes)",
    ]
    # An upstream tool's path argument naming it is refused before the call goes upstream.
    for mode in ("read", "write"):
        with pytest.raises(WorkspaceError, match="has 2 hard links"):
            check_path_arguments(scope.check, {"path": mode}, {"path": "innocent.txt"}, base=str(ws))
    # Once the other name is gone it is a plain file again.
    secret.unlink()
    assert read_file(scope.check, {"path": str(ws / "innocent.txt")}) == "top secret\n"


def test_text_with_a_lone_surrogate_is_refused_as_a_tool_error(scope: Scope, ws: Path) -> None:
    with pytest.raises(
        WorkspaceError, match="content is not valid Unicode text: a lone surrogate at character 1"
    ):
        write_file(scope.check, {"path": str(ws / "x.txt"), "content": "a\ud800b"})
    (ws / "y.txt").write_text("abc")
    with pytest.raises(WorkspaceError, match="new is not valid Unicode text"):
        edit_file(scope.check, {"path": str(ws / "y.txt"), "old": "b", "new": "\udfff"})
    with pytest.raises(WorkspaceError, match="not valid Unicode text"):
        read_file(scope.check, {"path": str(ws / "\ud800")})
    assert not (ws / "x.txt").exists()


def test_a_failed_write_removes_the_directories_it_made(
    scope: Scope, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workspace, "_write_all", disk_full)
    (ws / "kept").mkdir()
    with pytest.raises(OSError, match="No space left"):
        write_file(scope.check, {"path": str(ws / "kept" / "n1" / "n2" / "f.txt"), "content": "x"})
    assert sorted(p.name for p in ws.rglob("*")) == ["kept"]
