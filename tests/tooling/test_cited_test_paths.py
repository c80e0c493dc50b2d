"""Every ``tests/...`` path the repository cites (a file, a folder or a glob, in its docs, settings,
sources, pages and deploy files) names something that is there. When the tests moved into folders
(commit 6c3e860), five citations kept the old flat paths (``tests/test_api_*``,
``tests/test_compose.py``, ``tests/test_scheduler_probes.py``, ``tests/test_failure_contract.py``,
``tests/test_sse.py``); this fails naming each such one, with where it is cited.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from repo_paths import ROOT

SUFFIXES = {".md", ".toml", ".py", ".html", ".yml", ".yaml", ".pyi", ".proto", ".sh"}
"""The kinds of file read: docs, settings, sources, pages, deploy files, scripts."""

SKIPPED_DIRS = {"build", "dist", "node_modules", "state", "__pycache__"}
"""Folders not of the repository's own text (with every hidden one: ``.venv``, ``.git``, caches)."""

# A path starting at a top-level ``tests/`` (not ``deploy/prometheus/tests/...``, nor ``mytests/``);
# a glob keeps its ``*``; a sentence's full stop after it is not part of it.
CITED = re.compile(r"(?<![\w./-])tests/[\w./*?-]*")

NOT_PATHS = {
    # promtool runs in deploy/prometheus/ (or a copy of it): the path is relative to that folder
    "tests/tooling/test_prometheus_rules_and_dashboard.py": {"tests/alerts_test.yml"},
    # a name git must *not* ignore, asked of git on purpose: no such file is meant to exist
    "tests/stack/test_luftpause_up.py": {"tests/luftpause.toml"},
}
"""Citations that are not paths from the checkout's root, by the file that makes them."""


def _texts() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not (d.startswith(".") or d in SKIPPED_DIRS or d.endswith(".egg-info"))]
        for name in files:
            if Path(name).suffix in SUFFIXES:
                yield Path(folder) / name


def cited_paths(text: str) -> Iterator[str]:
    """The ``tests/...`` paths ``text`` cites, as written (less a trailing full stop)."""
    for match in CITED.finditer(text):
        yield match.group(0).rstrip(".")


def names_nothing(cited: str, citing: Path) -> bool:
    """Whether ``cited`` matches no file or folder, from the checkout's root or from the folder of
    the file ``citing`` it (``deploy/prometheus/alerts.yml`` cites its own ``tests/``)."""
    for base in (ROOT, citing.parent):
        if any(c in cited for c in "*?"):
            if next(base.glob(cited), None) is not None:
                return False
        elif (base / cited).exists():
            return False
    return True


def test_every_cited_test_path_names_a_file_or_folder_that_is_there() -> None:
    stale: list[str] = []
    files = 0
    citations = 0
    for path in _texts():
        if path == Path(__file__).resolve():
            continue  # its own examples of stale paths
        where = path.relative_to(ROOT).as_posix()
        files += 1
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for cited in cited_paths(line):
                citations += 1
                if cited not in NOT_PATHS.get(where, set()) and names_nothing(cited, path):
                    stale.append(f"{where}:{number}: {cited}")
    assert stale == [], "cited test paths that name nothing:\n" + "\n".join(stale)
    assert files > 100 and citations > 50  # the walk did reach the tree, and the tree does cite


def test_the_exceptions_are_still_cited_where_they_are_listed() -> None:
    """An exception whose citation went away is dropped, so the list cannot hide a new stale path."""
    for where, cited in NOT_PATHS.items():
        assert cited <= set(cited_paths((ROOT / where).read_text())), where


def test_a_stale_path_a_moved_one_and_a_glob_are_told_apart() -> None:
    citing = ROOT / "README.md"
    text = (
        "see tests/test_sse.py. and `tests/dataplane/test_sse_scanner.py`, "
        "tests/dataplane/front_doors/test_messages_*.py, tests/test_api_*, "
        "deploy/prometheus/tests/alerts_test.yml and tests/data/harnesses/"
    )
    cited = list(cited_paths(text))
    assert cited == [
        "tests/test_sse.py",
        "tests/dataplane/test_sse_scanner.py",
        "tests/dataplane/front_doors/test_messages_*.py",
        "tests/test_api_*",
        "tests/data/harnesses/",
    ]
    assert [c for c in cited if names_nothing(c, citing)] == ["tests/test_sse.py", "tests/test_api_*"]
