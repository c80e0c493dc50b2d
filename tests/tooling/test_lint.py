"""The code stays as STYLE.md asks: ruff clean (lint and format) and mypy --strict clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [
        [str(BIN / "ruff"), "check", "luftpause", "tests", "bench"],
        [str(BIN / "ruff"), "format", "--check", "luftpause", "tests", "bench"],
        [sys.executable, "-m", "mypy", "luftpause"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_the_tree_is_clean(argv: list[str]) -> None:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
