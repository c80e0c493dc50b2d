"""Start luftpause commands as real child processes on loopback, and wait until they answer.

Used by the tests, the benchmarks and ``luftpause up``. A process runs ``python -m luftpause
<command>`` with the interpreter that runs this module, or any other program (nginx, SGLang's
router) given whole with ``program=()``. Each runs in its own session, so that its whole process
group (a server's workers too) can be found, measured and ended.

Every process started here dies with the process that started it, even when that one is
SIGKILLed (a killed test run left a whole stack running 26 minutes later): the first start also
starts a *reaper*, a small helper process in its own session whose stdin is a pipe from this
process. Each child's process group is announced on that pipe when it starts (and withdrawn when
:meth:`ChildProcess.stop` or :meth:`ChildProcess.kill` has ended it). When this process ends, however
it ends, the kernel closes the pipe; the reaper reads end-of-file, sends SIGTERM to every group
still announced, SIGKILL to what is left :data:`REAPER_GRACE_S` later, and exits. A group whose
number was reused since (its leader alive but started later) is left alone. A process forked from
this one closes its copy of the pipe, so only this process's death counts.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

_HANDED_OUT: dict[int, None] = {}
"""The ports :func:`free_port` returned in this process, oldest first; the last
:data:`_REMEMBERED` only (the kernel hands out about 14,000 different ports)."""
_REMEMBERED = 4096


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that none of this process's
    last 4,096 calls returned.

    The kernel picks a random free port, and a port is free again as soon as the probing socket
    closes: two calls a moment apart returned the same port about once in 14,000 pairs (a stack
    takes seven ports before starting anything, so about once in 700 stacks), and the second
    server then failed to bind, or a port meant to stay unanswered was served. Remembering what
    was handed out (the last 4,096 ports) rules that out within the process (a test run); other
    processes can still race for a port between this call and the bind.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT[port] = None
            if len(_HANDED_OUT) > _REMEMBERED:
                del _HANDED_OUT[next(iter(_HANDED_OUT))]
            return port


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 0.5, context: ssl.SSLContext | None = None) -> bool:
    """True when ``GET url`` answers with any HTTP status below 500 (``context``: for ``https://``)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


LUFTPAUSE = (sys.executable, "-m", "luftpause")
"""The program of a ``luftpause`` command: this interpreter running the package."""

REAPER_GRACE_S = 5.0
"""Seconds the reaper gives the groups it SIGTERMs before it SIGKILLs them."""

_REAPER = r"""
import os, signal, sys, time

def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None

def members(pgid):
    found = False
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found = True
    return found

groups = {}
for line in sys.stdin:
    op, pgid, started = line.split()
    if op == "+":
        groups[int(pgid)] = started
    else:
        groups.pop(int(pgid), None)
# End of file: the process that started these groups is gone. Its groups go too, unless a number
# was reused (the group's leader alive, but not the process that was announced).
doomed = [g for g, started in groups.items() if start_time(g) in (started, None) and members(g)]
for pgid in doomed:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        pass
deadline = time.monotonic() + float(sys.argv[1])
while any(members(g) for g in doomed) and time.monotonic() < deadline:
    time.sleep(0.05)
for pgid in doomed:
    if members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
"""


class _Reaper:
    """This process's reaper (see the module docstring): :meth:`watch` and :meth:`forget` a
    process group. Started on first use, again if it died; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        self._owner = 0  # the pid that started it: a forked child has no reaper of its own yet
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        if self._pipe is not None:
            os.close(self._pipe)  # only the starting process's death may close the reaper's stdin
        self._pipe, self._proc, self._owner = None, None, 0

    def _write(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._owner != os.getpid():
                if line.startswith("-"):
                    return  # nothing announced to a reaper that is gone
                self._start()
            assert self._pipe is not None
            os.write(self._pipe, line.encode())

    def _start(self) -> None:
        if self._pipe is not None:
            os.close(self._pipe)
        read, write = os.pipe()  # both ends non-inheritable: no other child holds the write end
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _REAPER, str(REAPER_GRACE_S)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to this process's group does not reach it
            )
        finally:
            os.close(read)
        self._pipe, self._owner = write, os.getpid()

    def watch(self, pgid: int) -> None:
        """Announce process group ``pgid`` (its leader is the process ``pgid``, just started)."""
        self._write(f"+ {pgid} {_start_time(pgid)}\n")

    def forget(self, pgid: int) -> None:
        """Withdraw ``pgid``: it has ended (its number may be reused)."""
        self._write(f"- {pgid} -\n")


def _start_time(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (the start time in clock ticks), ``-`` when gone."""
    fields = stat_fields(pid)
    return fields[19] if fields is not None else "-"


REAPER = _Reaper()
"""The reaper of every process this module starts; :func:`reap_with_this_process` for others."""


def reap_with_this_process(proc: subprocess.Popen[bytes]) -> None:
    """Make ``proc`` (started with ``start_new_session=True``) and its group die with this process."""
    REAPER.watch(proc.pid)


class ChildProcess:
    """One command running as a child process in its own session, its output sent to ``log_path``.

    ``argv`` are the arguments after ``program``: by default ``program`` is :data:`LUFTPAUSE`, so
    ``ChildProcess("dp", ["dataplane", "--config", path])`` runs ``python -m luftpause dataplane
    ...``; ``program=()`` takes ``argv`` whole (``[NGINX, "-c", conf]``). ``self.argv`` is the whole
    command line, ``self.args`` the part after ``program``. ``env`` is added to this process's
    environment (``replace_env=True``: used instead of it); ``cwd`` is its working directory.
    ``ready_url`` (HTTP, ``https://`` verified with ``ready_context``) or ``ready_port`` (TCP)
    tells when it is serving; :meth:`wait_ready`
    raises ``RuntimeError`` with the end of its log when it exits first or takes too long.
    :meth:`start` may be called once only (``RuntimeError`` after that): a second start would
    lose the first process, still running, to nobody's stop.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        ready_url: str | None = None,
        ready_port: tuple[str, int] | None = None,
        *,
        program: Sequence[str] = LUFTPAUSE,
        cwd: Path | None = None,
        replace_env: bool = False,
        ready_context: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.program = tuple(program)
        self.args = list(argv)
        self.argv = [*self.program, *self.args]
        if not self.argv:
            raise ValueError(f"{name}: an empty command line")
        self.log_path = log_path
        self.ready_url = ready_url
        self.ready_port = ready_port
        self.ready_context = ready_context
        self.env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._append = False

    def again(self) -> ChildProcess:
        """A child like this one, not started, whose :meth:`start` appends to the same log (a
        supervisor's restart: ``luftpause up``)."""
        fresh = ChildProcess(
            self.name,
            self.args,
            self.log_path,
            self.env,
            self.ready_url,
            self.ready_port,
            program=self.program,
            cwd=self.cwd,
            replace_env=True,
            ready_context=self.ready_context,
        )
        fresh._append = True
        return fresh

    @property
    def pid(self) -> int | None:
        """The child's process id once started, else ``None``."""
        return None if self.proc is None else self.proc.pid

    def start(self) -> ChildProcess:
        """Start the process (once); ``self``. ``RuntimeError`` when it was started before."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} was already started (pid {self.proc.pid})")
        mode = "ab" if self._append else "wb"
        out = open(self.log_path, mode) if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        REAPER.watch(self.proc.pid)
        return self

    @property
    def pgid(self) -> int:
        """The process group of the child and everything it started (its pid, as session leader)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.proc.pid

    def group_pids(self) -> list[int]:
        """Live (not zombie) processes of the child's process group; empty before :meth:`start`."""
        return [] if self.proc is None else group_pids(self.proc.pid)

    def exited(self) -> bool:
        """True when the child (the group's leader) was started and has exited."""
        return self.proc is not None and self.proc.poll() is not None

    def is_ready(self) -> bool:
        if self.ready_url is not None:
            return http_ok(self.ready_url, context=self.ready_context)
        if self.ready_port is not None:
            return port_open(*self.ready_port)
        return True

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll every 0.05 s until the child answers; ``RuntimeError`` (with its log's end) when it
        exits first or ``timeout`` seconds pass. The deadline is for a loaded 2-core machine, where
        importing the package and starting a server can take many seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.is_ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``timeout`` seconds.

        The group is signalled even when its leader has already exited: a server's worker
        processes (granian's) outlive a leader that was killed.
        """
        if self.proc is None or (self.proc.poll() is not None and not _group_alive(self.proc.pid)):
            return  # all gone: its pid may already name someone else's group
        if not _signal_group(self.proc.pid, signal.SIGTERM):
            self.proc.wait()
            REAPER.forget(self.proc.pid)
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.poll()
            if not _group_alive(self.proc.pid):
                break
            time.sleep(0.02)
        else:
            self.kill()
        self.proc.wait()
        REAPER.forget(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the whole process group at once, and wait until every member is gone."""
        if self.proc is None or (self.proc.poll() is not None and not _group_alive(self.proc.pid)):
            return  # all gone: its pid may already name someone else's group
        _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 5
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not _group_alive(self.proc.pid):
            REAPER.forget(self.proc.pid)


def _signal_group(pgid: int, signum: int) -> bool:
    """Signal every process of group ``pgid``; False when none is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies of our own child aside)."""
    return bool(group_pids(pgid))


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ..., utime, stime at
    indexes 11 and 12 (proc(5) fields 3 onwards); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``; a zombie (Z) holds no port and is reaped by
    ``wait()``, so it is left out."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids
