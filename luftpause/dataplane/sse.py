"""Pick the SSE event scanner: the compiled twin if it was built, else the pure-Python one.

``LUFTPAUSE_NO_EXTENSIONS`` (any non-empty value) forces the pure twin, as it stops ``setup.py``
from building the extension. ``USING_EXTENSION`` tells which twin was taken; both behave the same
(see ``luftpause.dataplane._sse_py`` for the interface).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__all__ = ["USING_EXTENSION", "SSEScanner"]

USING_EXTENSION: bool

if TYPE_CHECKING:
    from luftpause.dataplane._sse_py import SSEScanner
elif os.environ.get("LUFTPAUSE_NO_EXTENSIONS"):
    from luftpause.dataplane._sse_py import SSEScanner

    USING_EXTENSION = False
else:
    try:
        from luftpause.dataplane._sse_c import SSEScanner

        USING_EXTENSION = True
    except ImportError:
        from luftpause.dataplane._sse_py import SSEScanner

        USING_EXTENSION = False
