"""How a luftpause process shows in ``ps``: its command line, whatever retitles it."""

from __future__ import annotations

import sys


def process_title() -> str:
    """``luftpause <command> [args...]``: the name a server passes to granian's ``process_name``.

    granian retitles its processes when ``setproctitle`` is installed (as some engines' tooling
    does); without a name of ours, ``ps`` would show ``granian asgi ...`` and lose the command
    and its ``--config``, which operators (and ``luftpause up``'s tests) look for.
    """
    return " ".join(["luftpause", *sys.argv[1:]])
