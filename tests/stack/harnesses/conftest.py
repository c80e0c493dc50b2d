"""Fixtures the real-harness tests share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def home() -> Iterator[str]:
    """A fresh ``$HOME`` for one harness run, under ``~/.cache/luftpause`` (the harnesses' own
    config and session files land there, not in the user's home), removed afterwards."""
    root = os.path.expanduser("~/.cache/luftpause")
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harness-", dir=root) as folder:
        yield folder
