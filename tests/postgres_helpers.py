"""A real PostgreSQL for the tests: a cluster of its own in a temporary folder (``initdb``), served
by ``pg_ctl`` on a free loopback port, one database per test.

Debian's ``postgresql`` package provides the binaries (``make test`` installs it where missing);
they are looked for on ``PATH``, then in ``/usr/lib/postgresql/<version>/bin``. Where they are
absent, :func:`find_binaries` says why and the tests that need a database skip with that reason.
PostgreSQL refuses to run as root: run as root (CI, these machines), the cluster belongs to the
``postgres`` user the package creates, and its commands run as that user.

Why not pytest-postgresql: the tests stop and restart the server in the middle of a run (a
database restart survived), run it as another user when root, and need nothing of the plugin's
configuration; the few calls below are the whole of it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from luftpause.testkit.launch.procs import free_port

BINARIES = ("initdb", "pg_ctl")

STORES = ("file", "postgresql")
"""The runtime's two stores, as the params of a fixture that runs a test on each: :func:`store_of`
gives the ``[runtime] store`` of one."""


def find_binaries() -> tuple[dict[str, str], str | None]:
    """``({name: path}, None)`` for ``initdb`` and ``pg_ctl``, or ``({}, why not)``."""
    found: dict[str, str] = {}
    for name in BINARIES:
        path = shutil.which(name)
        if path is None:
            candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
            path = candidates[-1] if candidates else None
        if path is None:
            return {}, f"PostgreSQL's {name} is not installed (apt-get install postgresql; make test does)"
        found[name] = path
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return {}, "running as root and there is no 'postgres' user to run PostgreSQL as"
    return found, None


@dataclass
class PostgresServer:
    """One running cluster: its folder, port and binaries. :meth:`database` makes a fresh
    database and gives its URL; :meth:`stop`, :meth:`start` and :meth:`restart` act on the server
    (the databases stay)."""

    root: Path
    port: int
    binaries: dict[str, str]
    user: str | None
    created: int = 0

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, name: str, *args: str, timeout: float = 60) -> None:
        command = [self.binaries[name], *args]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout, user=self.user)

    def url(self, database: str = "postgres") -> str:
        """The URL of ``database`` (password-less: the cluster trusts loopback)."""
        return f"postgresql://postgres:secret@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Stop (closing every connection) and start again on the same port."""
        self.stop()
        self.start()

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        self.created += 1
        name = f"test_{os.getpid()}_{self.created}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def query(self, url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """The rows of one query on the database at ``url``."""
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute(sql.encode(), params).fetchall()

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.root / "server.log").read_text().splitlines()[-lines:])
        return ""


def store_of(request: Any) -> str:
    """``[runtime] store`` for a fixture parametrised with ``params=STORES``, of any scope
    (``request``: its ``pytest.FixtureRequest``): ``"file"``, or the URL of a fresh database of the
    session's PostgreSQL (the ``postgres`` fixture, which skips with the reason where PostgreSQL
    is not installed)."""
    if request.param == "file":
        return "file"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.database()


def on_the_file_journal(fixture: str) -> Any:
    """A mark for a test of ``fixture`` (parametrised with ``params=STORES``) that the store cannot
    change (arguments refused before any run, an upstream server's tool listing, the start-up
    log): it runs on the default store only, on the same fixture as the other tests there."""
    import pytest

    return pytest.mark.parametrize(fixture, ["file"], indirect=True)


def store_line(store: str) -> str:
    """The ``[runtime]`` line that sets ``store`` in a configuration file (empty for the default,
    the file journal)."""
    return "" if store == "file" else f'store = "{store}"\n'


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A fresh cluster on a free loopback port, removed after. Raises ``RuntimeError`` with the
    reason when the binaries are missing (callers skip on it)."""
    binaries, why = find_binaries()
    if why is not None:
        raise RuntimeError(why)
    root = Path(tempfile.mkdtemp(prefix="luftpause-pg-"))
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        os.chmod(root, 0o755)
    server = PostgresServer(root, free_port(), binaries, user)
    try:
        server._run(
            "initdb",
            "-D",
            str(server.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            timeout=120,
        )
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                server.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)
