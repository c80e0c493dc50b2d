"""Where the checkout is, for tests in any folder under ``tests/``: they read files of the
repository (README.md, examples/, deploy/, luftpause's sources) and the test data by these
paths, never by counting ``parent`` from their own file, so a test file can move folders."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's checkout (the directory holding ``pyproject.toml``)."""

DATA = ROOT / "tests" / "data"
"""The tests' recorded and vendored data (``tests/data/README.md`` says where each came from)."""
