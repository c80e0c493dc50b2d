"""A stack whose dataplane and runtime take caller keys (:mod:`luftpause.auth.callers`), as the
caller-key, usage and tenant tests start it: one helper, so they cannot drift apart.

The keys every test may use are here too: :data:`TEAM_A` and :data:`TEAM_B` (two tenants' keys)
and :data:`RUNTIME_KEY` (the runtime's own, for its turns: ``[runtime] dataplane_key_env``), with
the keys file's entries for them (:func:`keys_file`, :data:`TEAMS`, :data:`RUNTIME`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomli_w

from luftpause.auth.callers import CALLER_KEYS_ENV
from luftpause.testkit.launch.stack import Stack

TEAM_A = "team-a-key-0123456789abcdef"
TEAM_B = "team-b-key-0123456789abcdef"
RUNTIME_KEY = "runtime-key-0123456789abcdef"
RUNTIME_KEY_ENV = "LUFTPAUSE_RUNTIME_KEY"
"""Where the runtime reads :data:`RUNTIME_KEY` from; a keys file names it as ``key_env``."""

TEAMS = [{"caller": "team-a", "key": TEAM_A}, {"caller": "team-b", "key": TEAM_B}]
"""The two tenants' entries, each with its key in plain text."""
RUNTIME = {"caller": "runtime", "key_env": RUNTIME_KEY_ENV}
"""The runtime's entry: its key from :data:`RUNTIME_KEY_ENV`."""


def keys_file(*entries: dict[str, Any]) -> str:
    """A caller keys file of ``entries``, each the fields of one ``[[keys]]`` table (TOML:
    docs/operating.md "Caller keys")."""
    return tomli_w.dumps({"keys": list(entries)})


@contextmanager
def keyed_stack(
    workdir: Path,
    keys: str,
    *,
    token: str,
    runtime_key: bool = False,
    dataplane: str = "",
    **start: Any,
) -> Iterator[Stack]:
    """A stack (``Stack.start(workdir, **start)``) with ``LUFTPAUSE_TOKEN`` ``token`` and the caller
    keys of ``keys`` (TOML ``[[keys]]`` text, :func:`keys_file`; written to
    ``workdir/callers.toml`` and named by ``[dataplane] caller_keys``; ``LUFTPAUSE_CALLER_KEYS`` is
    emptied, so no key comes from this process's environment). With ``runtime_key`` the runtime's
    own turns carry :data:`RUNTIME_KEY` (from :data:`RUNTIME_KEY_ENV`, which the keys file must
    name); ``dataplane`` adds lines to the ``[dataplane]`` table. Yielded once the dataplane is
    connected to the scheduler; stopped after.
    """
    path = workdir / "callers.toml"
    path.write_text(keys)
    env = {"LUFTPAUSE_TOKEN": token, CALLER_KEYS_ENV: ""}
    sections = {"dataplane": f'caller_keys = "{path}"\n{dataplane}'}
    if runtime_key:
        env[RUNTIME_KEY_ENV] = RUNTIME_KEY
        sections["runtime"] = f'dataplane_key_env = "{RUNTIME_KEY_ENV}"\n'
    with Stack.start(workdir, env=env, sections=sections, **start) as stack:
        stack.wait_connected()
        yield stack
