"""Named instructions: system prompts kept as files, picked by name at spawn.

``[runtime] instructions_dir = DIR`` makes every ``DIR/<name>.md`` an instruction:
``spawn(instruction="reviewer")`` gives the run the text of ``DIR/reviewer.md`` as its system
prompt. ``DIR/default.md``, when it exists, is the system prompt of every run spawned with neither
``instruction`` nor ``system``. ``system`` stays for inline text; a spawn that gives both is refused
(one system prompt, from one place).

A file is read when a run is spawned (so edits apply to the next spawn), as UTF-8, at most
:data:`~luftpause.runtime.runs.spec.MAX_TEXT_BYTES`; the run's journaled spec holds the text it got
and the name it came from, so a restart resumes it with the same prompt whatever the folder holds
then. Names are 1-64 characters of letters, digits, ``.``, ``_`` and ``-``, not starting with
``.``: a name is never a path.

Errors: :class:`~luftpause.runtime.errors.SpawnRefused` naming the instruction and what is
wrong (no folder configured, no such file: the names there are listed, too large, not UTF-8).
"""

from __future__ import annotations

import re
from pathlib import Path

from luftpause.runtime.errors import SpawnRefused
from luftpause.runtime.runs.spec import MAX_TEXT_BYTES

SUFFIX = ".md"
DEFAULT_NAME = "default"
"""The instruction of a run spawned without ``instruction`` or ``system``, when its file exists."""

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


class Instructions:
    """The instructions folder (``None``: none configured, so only inline ``system`` exists)."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = Path(directory) if directory is not None else None

    def names(self) -> list[str]:
        """The instructions there are now, sorted (``[]`` without a folder or when it cannot be read)."""
        if self.directory is None:
            return []
        try:
            found = [p.name[: -len(SUFFIX)] for p in self.directory.iterdir() if p.name.endswith(SUFFIX)]
        except OSError:
            return []
        return sorted(
            name for name in found if _NAME.fullmatch(name) and (self.directory / f"{name}{SUFFIX}").is_file()
        )

    def resolve(self, instruction: str | None, system: str | None) -> tuple[str | None, str | None]:
        """The system prompt and instruction name of a new run asked for ``instruction`` and
        ``system``: ``(system, None)`` for inline text, ``(file text, name)`` for a named one,
        the default instruction's when neither is given and it exists, else ``(None, None)``.
        Raises :class:`SpawnRefused` (module docstring)."""
        if instruction is not None and system:
            raise SpawnRefused(
                "give instruction or system, not both: instruction names a system prompt of "
                "[runtime] instructions_dir, system is one written inline"
            )
        if instruction is None:
            if system:
                return system, None
            if self.directory is not None and (self.directory / f"{DEFAULT_NAME}{SUFFIX}").is_file():
                return self._read(DEFAULT_NAME), DEFAULT_NAME
            return None, None
        if self.directory is None:
            raise SpawnRefused(
                f"instruction {instruction!r}: no [runtime] instructions_dir is configured, so there "
                "are no named instructions (give the system prompt inline with system)"
            )
        if not _NAME.fullmatch(instruction):
            raise SpawnRefused(
                f"instruction {instruction!r}: a name is 1-64 letters, digits, '.', '_' or '-', "
                "not starting with '.'"
            )
        return self._read(instruction), instruction

    def _read(self, name: str) -> str:
        assert self.directory is not None
        path = self.directory / f"{name}{SUFFIX}"
        try:
            with path.open("rb") as file:
                raw = file.read(MAX_TEXT_BYTES + 1)
        except FileNotFoundError:
            there = ", ".join(map(repr, self.names())) or "none"
            raise SpawnRefused(
                f"instruction {name!r}: no file {path} ([runtime] instructions_dir); "
                f"instructions there: {there}"
            ) from None
        except OSError as exc:
            raise SpawnRefused(f"instruction {name!r}: {path} cannot be read: {exc}") from None
        if len(raw) > MAX_TEXT_BYTES:
            raise SpawnRefused(
                f"instruction {name!r}: {path} is more than {MAX_TEXT_BYTES:,} bytes "
                f"({MAX_TEXT_BYTES / 1024 / 1024:g} MiB), the most a system prompt may hold"
            )
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpawnRefused(f"instruction {name!r}: {path} is not UTF-8 text ({exc})") from None
