"""The runtime's built-in workspace tools, each behind a scope check (docs/architecture.md "Pods").

Four tools a sub-agent can be offered (MCP tool shapes in :data:`TOOL_SCHEMAS`)::

    read_file(path, offset?: first line (1-based), limit?: lines)   -> the text, bounded
    write_file(path, content)                                        -> "wrote N bytes to P"
    edit_file(path, old, new)                                        -> "edited P: replaced line N"
    list_directory(path)                                             -> one entry per line

Each is a plain synchronous function ``tool(check, arguments, *, base=None) -> str`` (blocking
file IO of bounded size: the runtime calls it through ``asyncio.to_thread``). ``check`` is
``(real path, "read" | "write") -> Decision``, e.g. ``functools.partial(ledger.check, handle)``
or ``scope.check``. ``base`` is the directory relative paths are taken from (the workspace root);
without it a relative path is refused.

Paths are judged by where they really point: :func:`resolve` applies ``os.path.realpath`` (every
``..`` and symlink, a symlink inside the scope pointing outside it, a path whose parent directory
is a symlink) before the check, and files are then opened with ``O_NOFOLLOW``, so a symlink put
in place of the file itself between check and open makes the call fail rather than escape. (A
directory swapped for a symlink in that instant is not caught: that needs ``openat2``'s
``RESOLVE_BENEATH``, which Python does not expose; sub-agents have no shell to race with.)

Hard links: ``realpath`` cannot tell that a file inside the scope is also a name outside it (a
hard link is not a symlink: both names are the file), so reading it would read a file outside the
scope, and writing the inode in place would change both. Every tool therefore refuses a regular
file with more than one link (``st_nlink > 1``, :func:`refuse_hard_links`): ``read_file``,
``write_file`` and ``edit_file`` check it on the open descriptor before anything is read or
written; ``list_directory`` shows such a file without its size (``name  (N hard links: not
read)``); an upstream tool's declared path argument naming one is refused before the call goes
upstream. Proving instead that every other name lies inside the scope would mean finding them, a
walk of the whole file system (a link may be anywhere on the same device); it is not done. (So a
file hard-linked on purpose inside the workspace, as ``git clone`` of a local repository and
``pnpm`` stores do, is refused too: copy it to read it.) For writes, a temporary file renamed over
the name was the other choice; it was not taken because the temporary name would be written in
the directory, which a scope of single files does not allow, and a rename drops the file's owner,
extended attributes and other metadata. Residual limits: a hard link made to the file after that
check (by another process: sub-agents cannot make links) is read or written through; a path is
judged when it is checked, not for as long as an upstream server holds it, and a directory given
to an upstream tool is not searched for hard-linked files inside it.

Text: ``content``, ``old`` and ``new`` must be valid Unicode (a lone surrogate is refused, saying
where); file names that are not UTF-8 are listed with ``\\xNN`` escapes (:func:`shown`).

Bounds: a read returns at most :data:`MAX_READ_BYTES` and says how to read on; ``write_file``
and ``edit_file`` handle files up to :data:`MAX_WRITE_BYTES`; a listing shows at most
:data:`MAX_LIST_ENTRIES` entries. Only regular files are read or written (a FIFO or device is
refused, never blocked on).

Upstream tools' path arguments: ``[[mcp_servers]] path_arguments`` declares, per tool, which
arguments are paths and the access they need::

    path_arguments = { write_note = ["path"], search = { root = "read" } }

(a list means ``write`` for each; a table gives ``read`` or ``write`` per argument).
:func:`path_arguments` reads it, :func:`check_path_arguments` checks a call against a scope before
it goes upstream and gives the real paths it checked, which are what the call then carries (never
the path as asked). A path argument must be a filesystem path: ``~...`` and URIs
(``file:///...``, anything starting ``scheme:``) are refused. Real paths are those of the
runtime's filesystem, so this is meaningful for
servers that share it (a stdio server it starts, a server on the same volume).

Errors: :class:`~luftpause.runtime.pods.scope.ScopeDenied` (403) with the real path and the rule (and
the path as asked, when it resolved elsewhere); :class:`WorkspaceError` (400) for anything else
(missing file, ``old`` missing or not unique, too large, not a regular file, bad arguments).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Mapping
from typing import Any

from luftpause.runtime.errors import WorkspaceError
from luftpause.runtime.pods.scope import MODES, Decision, Mode, normalize_path

Check = Callable[[str, Mode], Decision]
"""``(real path, mode) -> Decision``: the scope the tool runs under."""

MAX_READ_BYTES = 256 * 1024
"""Bytes of file text one ``read_file`` returns at most."""
MAX_WRITE_BYTES = 1024 * 1024
"""Largest file (bytes, UTF-8) ``write_file`` writes and ``edit_file`` edits."""
MAX_LIST_ENTRIES = 1000
"""Entries one ``list_directory`` shows at most."""
MAX_SCAN_ENTRIES = 100 * MAX_LIST_ENTRIES
"""Directory entries one ``list_directory`` looks at before it stops counting."""
_SKIP_CHUNK = 64 * 1024


# --- paths -----------------------------------------------------------------------------------------


def resolve(path: Any, base: str | None = None) -> str:
    """The real, normalized absolute path ``path`` points to (``os.path.realpath``: symlinks and
    ``..`` followed; components that do not exist yet are kept as written). Relative paths are
    taken from ``base``; raises :class:`WorkspaceError` for a non-string, empty or relative path
    without ``base``."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise WorkspaceError(f"expected a path (a non-empty string), got {path!r}")
    if not _encodable(path):
        raise WorkspaceError(f"the path {path!r} is not valid Unicode text (a lone surrogate)")
    if path.startswith("~"):
        # Never expanded here, but a server given it might expand it to a home outside the scope.
        raise WorkspaceError(f"expected a path, got {path!r}: '~' is not expanded; give the path itself")
    if _URI.match(path):
        raise WorkspaceError(
            f"expected a filesystem path, got {path!r}, which looks like a URI (scheme:); "
            "write ./name for a relative file whose name has a colon"
        )
    if not os.path.isabs(path):
        if base is None:
            raise WorkspaceError(f"expected an absolute path, got {path!r}")
        path = os.path.join(base, path)
    return normalize_path(os.path.realpath(path))


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(name: str) -> str:
    """A file name as text that any UTF-8 output takes: bytes that are not UTF-8 (kept by Python
    as lone surrogates) are written as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", errors="backslashreplace")


def checked(check: Check, path: Any, mode: Mode, base: str | None = None) -> str:
    """``path`` resolved and allowed for ``mode``; raises ``ScopeDenied`` naming the rule."""
    real = resolve(path, base)
    check(real, mode).require(asked=path)
    return real


# --- the tools -------------------------------------------------------------------------------------


def read_file(check: Check, arguments: Mapping[str, Any], *, base: str | None = None) -> str:
    """The text of ``arguments["path"]`` (UTF-8, undecodable bytes replaced), from line ``offset``
    (1-based, default 1) for ``limit`` lines (default: to the end), at most :data:`MAX_READ_BYTES`;
    when cut, a last line in brackets says where and with which ``offset`` to read on. Needs read."""
    offset = _int_argument(arguments, "offset", 1)
    limit = _int_argument(arguments, "limit", None)
    real = checked(check, _argument(arguments, "path"), "read", base)
    fd = _open_regular(real, os.O_RDONLY)
    with os.fdopen(fd, "rb") as file:
        refuse_hard_links(os.fstat(fd), real, "read")
        text, note = _read_lines(file, offset, limit)
    return text.decode("utf-8", errors="replace") + (f"\n[{note}]" if note else "")


def write_file(check: Check, arguments: Mapping[str, Any], *, base: str | None = None) -> str:
    """Write ``content`` (at most :data:`MAX_WRITE_BYTES` as UTF-8) to ``path``, replacing it or
    creating it and any missing parent directories (each of which must be writable too). Needs
    write."""
    path = _argument(arguments, "path")
    content = _argument(arguments, "content")
    data = _utf8("content", content)
    if len(data) > MAX_WRITE_BYTES:
        raise WorkspaceError(f"content is {len(data)} bytes; write_file writes at most {MAX_WRITE_BYTES}")
    real = checked(check, path, "write", base)
    made = _make_parents(check, real, path)
    try:
        fd = _open_regular(real, os.O_WRONLY | os.O_CREAT)
        try:
            refuse_hard_links(os.fstat(fd), real, "write")
            os.ftruncate(fd, 0)
            _write_all(fd, data)
        finally:
            os.close(fd)
    except BaseException:
        if made:  # the file is new too (its parents were): a failed write leaves nothing behind
            with contextlib.suppress(OSError):
                os.unlink(real)
            _remove_made(made)
        raise
    return f"wrote {len(data)} bytes to {real}"


def edit_file(check: Check, arguments: Mapping[str, Any], *, base: str | None = None) -> str:
    """Replace the one occurrence of ``old`` in ``path`` by ``new`` (exact text, as the field's
    edit tools do). Refused, saying which, when ``old`` is empty, missing, or occurs more than once
    (with the lines it occurs on), when ``old == new``, and for files past :data:`MAX_WRITE_BYTES`
    or not UTF-8. Needs read and write."""
    path = _argument(arguments, "path")
    old = _argument(arguments, "old")
    new = _argument(arguments, "new")
    _utf8("old", old)
    _utf8("new", new)
    if not old:
        raise WorkspaceError("old is empty: give the exact text to replace")
    if old == new:
        raise WorkspaceError("old and new are the same text: nothing to edit")
    real = checked(check, path, "read", base)
    check(real, "write").require(asked=path)
    fd = _open_regular(real, os.O_RDWR)
    try:
        refuse_hard_links(os.fstat(fd), real, "write")
        size = os.fstat(fd).st_size
        if size > MAX_WRITE_BYTES:
            raise WorkspaceError(f"{real} is {size} bytes; edit_file edits files up to {MAX_WRITE_BYTES}")
        try:
            text = _read_all(fd, size).decode("utf-8")
        except UnicodeDecodeError as err:
            raise WorkspaceError(f"{real} is not UTF-8 text ({err.reason} at byte {err.start})") from None
        starts = _occurrences(text, old)
        if not starts:
            raise WorkspaceError(f"old text not found in {real}")
        if len(starts) > 1:
            lines = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts[:10])
            raise WorkspaceError(
                f"old text occurs {len(starts)} times in {real} (at lines {lines}): "
                "give more surrounding text so it occurs once"
            )
        at = starts[0]
        line = text.count("\n", 0, at) + 1
        data = (text[:at] + new + text[at + len(old) :]).encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise WorkspaceError(f"the edit makes {real} {len(data)} bytes; the limit is {MAX_WRITE_BYTES}")
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        _write_all(fd, data)
    finally:
        os.close(fd)
    return f"edited {real}: replaced the text at line {line}"


def list_directory(check: Check, arguments: Mapping[str, Any], *, base: str | None = None) -> str:
    """The entries of directory ``path``, one per line: ``name/`` for a directory, ``name ->
    target`` for a symlink, ``name  (N bytes)`` for a file, ``name  (N hard links: not read)`` for
    a file with other names (module docstring; names that are not UTF-8 shown with ``\\xNN``,
    :func:`shown`). The first line is the directory's real path.

    Bounded: the directory is read entry by entry (``os.scandir``), the first
    :data:`MAX_LIST_ENTRIES` readable entries in directory order are kept and shown sorted by
    name; the rest are only counted, up to :data:`MAX_SCAN_ENTRIES` looked at. Entries the scope
    does not let the caller read are left out and counted apart (never in the "more" count).
    Needs read."""
    real = checked(check, _argument(arguments, "path"), "read", base)
    kept: list[os.DirEntry[str]] = []
    hidden = more = scanned = 0
    try:
        with os.scandir(real) as scan:
            for entry in scan:
                scanned += 1
                if scanned > MAX_SCAN_ENTRIES:
                    break
                if not check(normalize_path(entry.path), "read").allowed:
                    hidden += 1
                elif len(kept) < MAX_LIST_ENTRIES:
                    kept.append(entry)
                else:
                    more += 1
    except OSError as err:
        raise WorkspaceError(f"cannot list {real}: {err.strerror}") from None
    lines = [f"{shown(real)}:"]
    lines.extend(_describe(entry) for entry in sorted(kept, key=lambda e: e.name))
    if more:
        shown_note = f"{len(kept)} shown, the first in directory order"
        lines.append(f"[and {more} more readable entries not shown: {shown_note}]")
    if hidden:
        lines.append(f"[{hidden} entries left out: outside the readable scope]")
    if scanned > MAX_SCAN_ENTRIES:
        lines.append(f"[stopped after looking at {MAX_SCAN_ENTRIES} entries; the directory has more]")
    return "\n".join(lines)


TOOLS: dict[str, Callable[..., str]] = {
    "read_file": read_file,
    "write_file": write_file,
    "edit_file": edit_file,
    "list_directory": list_directory,
}
"""The built-in tools by name, each ``(check, arguments, *, base=None) -> str``."""

_PATH = {"type": "string", "description": "absolute path, or relative to the workspace root"}
TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "name": "read_file",
        "description": (
            f"Read a text file, whole or from line `offset` for `limit` lines; at most {MAX_READ_BYTES} "
            "bytes per call, and a cut read says which offset reads on."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1, "description": "first line to read, from 1"},
                "limit": {"type": "integer", "minimum": 1, "description": "number of lines to read"},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
    },
    {
        "name": "write_file",
        "description": (
            f"Write a text file (at most {MAX_WRITE_BYTES} bytes), replacing it if it exists and "
            "creating missing parent directories."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        "annotations": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": True,
            "openWorldHint": False,
        },
    },
    {
        "name": "edit_file",
        "description": (
            "Replace one exact occurrence of `old` by `new` in a text file; refused when `old` is "
            "missing or occurs more than once (include more surrounding text to make it unique)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": _PATH,
                "old": {"type": "string", "minLength": 1, "description": "exact text to replace"},
                "new": {"type": "string", "description": "replacement text"},
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
        "annotations": {
            "readOnlyHint": False,
            "destructiveHint": True,
            "idempotentHint": False,
            "openWorldHint": False,
        },
    },
    {
        "name": "list_directory",
        "description": "List a directory: `name/` for directories, `name -> target` for symlinks.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": _PATH},
            "required": ["path"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
    },
)
"""MCP tool shapes (``tools/list``: ``name``, ``description``, ``inputSchema``, ``annotations``)."""


# --- upstream tools' path arguments ------------------------------------------------------------


def path_arguments(tool_config: Any) -> dict[str, dict[str, Mode]]:
    """``{tool: {argument: mode}}`` from a server's ``path_arguments`` (an object with that
    attribute, e.g. ``McpServerConfig``, or the mapping itself; ``None`` or absent: no paths).
    Each tool's value is a list of argument names (each needing ``write``) or a mapping of argument
    name to ``"read"``/``"write"``. Raises ``ValueError`` on any other shape."""
    declared = (
        tool_config
        if tool_config is None or isinstance(tool_config, Mapping)
        else getattr(tool_config, "path_arguments", None)
    )
    if declared is None:
        return {}
    if not isinstance(declared, Mapping):
        raise ValueError(f"path_arguments: expected a table of tool names, got {declared!r}")
    result: dict[str, dict[str, Mode]] = {}
    for tool, spec in declared.items():
        if isinstance(spec, str) or not isinstance(spec, list | tuple | Mapping):
            raise ValueError(
                f"path_arguments.{tool}: expected a list of argument names or a table, got {spec!r}"
            )
        pairs = spec.items() if isinstance(spec, Mapping) else ((name, "write") for name in spec)
        result[str(tool)] = {}
        for name, mode in pairs:
            if not isinstance(name, str) or mode not in MODES:
                raise ValueError(
                    f"path_arguments.{tool}: expected argument = 'read' | 'write', got {name!r} = {mode!r}"
                )
            result[str(tool)][name] = mode
    return result


def check_path_arguments(
    check: Check, declared: Mapping[str, Mode], arguments: Mapping[str, Any], *, base: str | None = None
) -> dict[str, str | list[str]]:
    """Check a call's declared path ``arguments`` (``declared``: one tool's entry of
    :func:`path_arguments`) against ``check``; returns ``{argument: real path (or list of them)}``
    for each one given, which is what must be sent upstream: the path that was checked, not the
    one asked (a relative path, ``..``, or a symlink the server might resolve differently). An
    argument may be a path or a list of paths; absent or ``null`` ones are skipped. Raises
    ``ScopeDenied`` for the first one denied, and :class:`WorkspaceError` for a value that is not
    a filesystem path (not a string, ``~...``, a URI such as ``file://...``, a lone surrogate) or
    that names a regular file with more than one hard link (:func:`refuse_hard_links`)."""
    real: dict[str, str | list[str]] = {}
    for name, mode in declared.items():
        value = arguments.get(name)
        if value is None:
            continue
        paths = value if isinstance(value, list) else [value]
        if any(not isinstance(path, str) for path in paths):
            raise WorkspaceError(f"argument {name!r}: expected a path or a list of paths, got {value!r}")
        checked_paths = [checked(check, path, mode, base) for path in paths]
        for path in checked_paths:
            try:
                found = os.lstat(path)
            except OSError:
                continue  # not there (yet): nothing to read through
            refuse_hard_links(found, path, mode)
        real[name] = checked_paths if isinstance(value, list) else checked_paths[0]
    return real


# --- helpers ---------------------------------------------------------------------------------------


def _argument(arguments: Mapping[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise WorkspaceError(f"argument {name!r}: expected a string, got {value!r}")
    return value


def _int_argument(arguments: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = arguments.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkspaceError(f"argument {name!r}: expected an integer of at least 1, got {value!r}")
    return value


def _open_regular(real: str, flags: int) -> int:
    """A descriptor on regular file ``real``; ``O_NOFOLLOW`` so a symlink swapped in after the check
    fails, ``O_NONBLOCK`` so a FIFO is refused rather than waited on."""
    try:
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise WorkspaceError(f"cannot open {real}: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WorkspaceError(f"{real} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _utf8(name: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise WorkspaceError(
            f"{name} is not valid Unicode text: a lone surrogate at character {err.start}"
        ) from None


def refuse_hard_links(found: os.stat_result, real: str, mode: Mode) -> None:
    """Raise :class:`WorkspaceError` when ``found`` (the ``stat`` of ``real``, from its open
    descriptor where there is one) is a regular file with other names: they may be outside the
    scope (a hard link is not a symlink: ``realpath`` cannot see it), so reading it may read a file
    outside the scope, and writing it in place would change what those names show too."""
    links = found.st_nlink
    if links <= 1 or not stat.S_ISREG(found.st_mode):
        return
    if mode == "read":
        raise WorkspaceError(
            f"{real} has {links} hard links: it is also a file under other names, which may be "
            "outside your scope, so it is not read; ask for a copy of it"
        )
    raise WorkspaceError(
        f"{real} has {links} hard links: writing it would change the file under its other "
        "names too, which may be outside your scope; write a new file instead"
    )


def _remove_made(made: list[str]) -> None:
    for directory in reversed(made):
        try:
            os.rmdir(directory)
        except OSError:
            return  # not empty any more (someone wrote into it meanwhile): leave it and its parents


def _make_parents(check: Check, real: str, asked: str) -> list[str]:
    """Make the missing parent directories of ``real`` (each checked for write first); returns
    those made, outermost first."""
    missing: list[str] = []
    parent = os.path.dirname(real)
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        check(directory, "write").require(asked=asked)
    made: list[str] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
            made.append(directory)
        except FileExistsError:
            pass  # made meanwhile by someone else: fine, it is what we wanted
        except OSError as err:
            _remove_made(made)
            raise WorkspaceError(f"cannot make directory {directory}: {err.strerror}") from None
    return made


def _read_lines(file: Any, offset: int | None, limit: int | None) -> tuple[bytes, str | None]:
    """Lines ``offset`` (1-based) .. ``offset + limit - 1`` of ``file``, at most MAX_READ_BYTES, and
    a note when cut. Reads in bounded pieces, so a huge file or line never sits in memory whole."""
    first = offset or 1
    line = 1
    out = bytearray()
    in_line = False  # inside a line not yet ended by "\n" (a last line may have none)
    while line < first:
        piece = file.readline(_SKIP_CHUNK)
        if not piece:
            lines = line - 1 + in_line
            return b"", f"the file has {lines} lines; offset {first} is past its end"
        in_line = not piece.endswith(b"\n")
        if not in_line:
            line += 1
    while limit is None or line < first + limit:
        start = len(out)
        room = MAX_READ_BYTES - start
        piece = file.readline(room + 1)
        if not piece:
            return bytes(out), None
        if len(piece) > room:
            if start:
                del out[start:]
                note = f"cut at {MAX_READ_BYTES} bytes before line {line}; read on with offset={line}"
                return bytes(out), note
            out += piece[:room]
            note = f"line {line} is longer than {MAX_READ_BYTES} bytes and is cut"
            return bytes(out), f"{note}; the next line is offset={line + 1}"
        out += piece
        if piece.endswith(b"\n"):
            line += 1
    if file.read(1):
        return bytes(out), f"stopped after {limit} lines; read on with offset={line}"
    return bytes(out), None


def _read_all(fd: int, size: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, max(size, 1) + 1):
        chunks.append(chunk)
        if sum(map(len, chunks)) > MAX_WRITE_BYTES:
            raise WorkspaceError(f"file grew past {MAX_WRITE_BYTES} bytes while being read")
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _occurrences(text: str, old: str) -> list[int]:
    """Every start of ``old`` in ``text``, overlapping ones included (``aa`` in ``aaa`` is two)."""
    starts = []
    at = text.find(old)
    while at != -1:
        starts.append(at)
        at = text.find(old, at + 1)
    return starts


def _describe(entry: os.DirEntry[str]) -> str:
    try:
        name = shown(entry.name)
        if entry.is_symlink():
            return f"{name} -> {shown(os.readlink(entry.path))}"
        if entry.is_dir(follow_symlinks=False):
            return f"{name}/"
        found = entry.stat(follow_symlinks=False)
        if found.st_nlink > 1 and stat.S_ISREG(found.st_mode):  # its size is the other file's too
            return f"{name}  ({found.st_nlink} hard links: not read)"
        return f"{name}  ({found.st_size} bytes)"
    except OSError:
        return f"{shown(entry.name)}  (vanished)"
