"""``tools/release.sh`` in ``DRY_RUN=1`` mode, in a throwaway git repository holding a copy of it.

The dry run prints the commands a release would run; the checks (version shape, clean tree,
tag not yet taken) run as in a real release.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "release.sh"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit holding ``tools/release.sh``; a clean tree."""
    (tmp_path / "tools").mkdir()
    shutil.copy(SCRIPT, tmp_path / "tools" / "release.sh")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "one")
    return tmp_path


def release(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "REMOTE")}
    environment.update({"DRY_RUN": "1", **env})
    return subprocess.run(
        ["bash", str(repo / "tools" / "release.sh"), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=30,
    )


def commands(output: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in output.splitlines() if line.startswith("+ ")]


def test_dry_run_prints_build_push_and_git_tag(repo: Path) -> None:
    result = release(repo, "v1.2.3")
    assert result.returncode == 0, result.stderr
    printed = commands(result.stdout)
    image = "ghcr.io/luftpause/luftpause"
    revision = git(repo, "rev-parse", "HEAD")
    build = printed[0]
    assert build[:2] == ["docker", "build"] and build[-1] == "."
    assert f"org.opencontainers.image.revision={revision}" in build
    assert [build[i + 1] for i, arg in enumerate(build) if arg == "--tag"] == [
        f"{image}:v1.2.3",
        f"{image}:latest",
    ]
    assert printed[1:] == [
        ["docker", "push", f"{image}:v1.2.3"],
        ["docker", "push", f"{image}:latest"],
        ["git", "tag", "--annotate", "v1.2.3", "--message", "luftpause v1.2.3"],
        ["git", "push", "origin", "v1.2.3"],
    ]
    assert git(repo, "tag") == ""  # a dry run tags nothing


def test_registry_is_overridable(repo: Path) -> None:
    result = release(repo, "v0.1.0", REGISTRY="registry.example.com:5000/team/")
    assert result.returncode == 0, result.stderr
    assert ["docker", "push", "registry.example.com:5000/team/luftpause:v0.1.0"] in commands(result.stdout)


@pytest.mark.parametrize("version", ["1.2.3", "v1.2", "v1.2.3-rc1", "v01.2.3", "vX.Y.Z", ""])
def test_refuses_a_version_not_of_the_form_vxyz(repo: Path, version: str) -> None:
    result = release(repo, version)
    assert result.returncode == 2
    assert "vX.Y.Z" in result.stderr and commands(result.stdout) == []


def test_refuses_without_exactly_one_argument(repo: Path) -> None:
    assert release(repo).returncode == 2
    assert release(repo, "v1.0.0", "v1.0.1").returncode == 2


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_refuses_a_dirty_tree_and_names_the_files(repo: Path, change: str) -> None:
    if change == "modified":
        (repo / "tools" / "release.sh").write_text((repo / "tools" / "release.sh").read_text() + "\n")
    else:
        (repo / "notes.txt").write_text("x")
    result = release(repo, "v1.2.3")
    assert result.returncode == 1
    assert "not clean" in result.stderr
    assert ("tools/release.sh" if change == "modified" else "notes.txt") in result.stderr
    assert commands(result.stdout) == []


def test_refuses_a_tag_that_exists(repo: Path) -> None:
    git(repo, "tag", "v1.2.3")
    result = release(repo, "v1.2.3")
    assert result.returncode == 1 and "already exists" in result.stderr
