"""The dev install is pinned: `requirements/dev.lock` (uv's resolution of `.[dev]`, refreshed by
`make lock`) names every package the dev install needs, with `==`, and the virtual environment the
tests run in holds exactly those versions. A new release of a dependency therefore cannot change
what `make test` installs on a fresh clone; only a committed refresh of the lock can."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "dev.lock"


def pins() -> dict[str, tuple[str, str | None]]:
    """name -> (version, marker or None) for every requirement line of the lock."""
    found: dict[str, tuple[str, str | None]] = {}
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith((" ", "#")):
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", line
        marker = str(requirement.marker) if requirement.marker else None
        found[canonicalize_name(requirement.name)] = (specifiers[0].version, marker)
    return found


def test_every_line_of_the_lock_is_an_exact_pin() -> None:
    assert len(pins()) > 100


def test_the_installed_environment_is_the_lock() -> None:
    drift = []
    for name, (version, marker) in pins().items():
        if marker is not None and not Marker(marker).evaluate():
            continue
        installed = importlib.metadata.version(name)
        if installed != version:
            drift.append(f"{name}: lock {version}, installed {installed}")
    assert drift == [], "the venv drifted from requirements/dev.lock (run make install):\n" + "\n".join(drift)


def test_every_dependency_of_the_dev_install_is_pinned() -> None:
    """Walks the installed `luftpause[dev]` closure: nothing it needs escapes the lock."""
    locked = pins()
    seen: set[str] = set()
    missing: list[str] = []

    def walk(name: str, extras: frozenset[str]) -> None:
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            return
        seen.add(key)
        requires = importlib.metadata.requires(name) or []
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                continue
            dependency = canonicalize_name(requirement.name)
            if dependency == "luftpause":
                walk("luftpause", frozenset(requirement.extras))
                continue
            if dependency not in locked:
                missing.append(f"{dependency} (needed by {name})")
                continue
            walk(dependency, frozenset(requirement.extras))

    walk("luftpause", frozenset({"dev"}))
    assert missing == []


def test_the_makefile_installs_from_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^LOCK\s*:=\s*requirements/dev\.lock$", makefile, re.M)
    assert "pip install --quiet --progress-bar off -r $(LOCK)" in makefile
    assert "-c $(LOCK) -e '.[dev]'" in makefile
