"""What the scheduler's page and the runtime's monitor share: one look (``look.html``: the style
blocks) and one vocabulary for run states with the charts of the last minutes (``states.html``: the
shared script), each written once here and inlined into both pages where a page has the line
``<!-- luftpause.pages: NAME -->``.

Each page stays one self-contained document (no asset, no build step): :func:`assemble` runs when a
process reads its page, and the Content-Security-Policy hashes are taken from the assembled bytes.
"""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["assemble"]

_PART = re.compile(rb"^<!-- luftpause\.pages: ([a-z_]+\.html) -->\n", re.MULTILINE)


def assemble(page: bytes) -> bytes:
    """``page`` with every ``<!-- luftpause.pages: NAME -->`` line replaced by this package's file
    NAME. Raises ``FileNotFoundError`` for a name this package does not have (or when the package
    was installed without its data files)."""
    return _PART.sub(lambda match: _part(match.group(1).decode()), page)


def _part(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()
