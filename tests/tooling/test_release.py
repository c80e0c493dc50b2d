"""``tools/release.sh`` in a throwaway git repository holding a copy of it, with a bare repository
in a temporary directory as its ``origin``, a recording ``docker`` on ``PATH`` and a recording
``tools/dist.sh`` beside the script.

A dry run prints the commands a release would run; the checks (version shape, clean tree, version
matching ``pyproject.toml``, tag not yet taken here or on the remote) run as in a real release. A
real release runs against the fake ``docker`` and ``tools/dist.sh``, which append each call to one
file, so the order of git tag, package build and image pushes is observed. The real
``tools/dist.sh`` (sdist, manylinux wheel, twine check) is run by tests/tooling/test_packaging.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from repo_paths import ROOT

SCRIPT = ROOT / "tools" / "release.sh"
IMAGE = "ghcr.io/luftpause/luftpause"
IDENTITY = ("-c", "user.name=t", "-c", "user.email=t@example.invalid")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *IDENTITY, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def set_version(repo: Path, version: str) -> None:
    """Commit ``pyproject.toml`` with ``[project] version = version`` (no leading ``v``)."""
    (repo / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "luftpause"\nversion = "{version}"\n'
        '\n[tool.other]\nversion = "9.9.9"\n'
    )
    git(repo, "add", "pyproject.toml")
    git(repo, "commit", "-q", "-m", f"version {version}")


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """A bare repository, the ``origin`` of :func:`repo`."""
    path = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


def recorder(path: Path, calls: Path, fail: Path, name: str) -> None:
    """An executable at ``path`` appending ``name`` and its arguments (shell-quoted, one call a
    line) to ``calls``; it fails when ``fail`` exists."""
    path.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%q " {shlex.quote(name)} "$@" >> {shlex.quote(str(calls))}\n'
        f"echo >> {shlex.quote(str(calls))}\n"
        f"[[ ! -e {shlex.quote(str(fail))} ]]\n"
    )
    path.chmod(0o755)


@pytest.fixture
def repo(tmp_path: Path, remote: Path) -> Path:
    """A git repository holding ``tools/release.sh``, a fake ``tools/dist.sh`` (recording into
    ``bin/calls`` beside the repository, failing when ``bin/dist-fail`` exists) and
    ``pyproject.toml`` at 1.2.3; clean tree, ``origin`` is :func:`remote`."""
    path = tmp_path / "repo"
    (path / "tools").mkdir(parents=True)
    shutil.copy(SCRIPT, path / "tools" / "release.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder(path / "tools" / "dist.sh", bin_dir / "calls", bin_dir / "dist-fail", "tools/dist.sh")
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "one")
    set_version(path, "1.2.3")
    git(path, "remote", "add", "origin", str(remote))
    git(path, "push", "-q", "origin", "HEAD:refs/heads/main")
    return path


@pytest.fixture
def docker(tmp_path: Path) -> Path:
    """A directory with a fake ``docker`` that appends its arguments (one call a line, shell-quoted)
    to ``calls`` beside it; it fails when the file ``fail`` exists there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    recorder(bin_dir / "docker", bin_dir / "calls", bin_dir / "fail", "docker")
    return bin_dir


def release(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "REMOTE", "DRY_RUN")}
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


def docker_calls(docker: Path) -> list[list[str]]:
    calls = docker / "calls"
    return [shlex.split(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def remote_tags(remote: Path) -> list[str]:
    return git(remote, "tag").split()


def test_dry_run_prints_tag_build_push_in_order(repo: Path) -> None:
    result = release(repo, "v1.2.3")
    assert result.returncode == 0, result.stderr
    printed = commands(result.stdout)
    revision = git(repo, "rev-parse", "HEAD")
    assert printed[0] == ["git", "tag", "--annotate", "v1.2.3", "--message", "luftpause v1.2.3"]
    assert printed[1] == ["tools/dist.sh", "dist/v1.2.3"]  # sdist and wheel, from the tagged tree
    build = printed[2]
    assert build[:2] == ["docker", "build"] and build[-1] == "."
    assert f"org.opencontainers.image.revision={revision}" in build
    assert [build[i + 1] for i, arg in enumerate(build) if arg == "--tag"] == [
        f"{IMAGE}:v1.2.3",
        f"{IMAGE}:latest",
    ]
    assert printed[3:] == [
        ["git", "push", "origin", "refs/tags/v1.2.3"],
        ["docker", "push", f"{IMAGE}:v1.2.3"],
        ["docker", "push", f"{IMAGE}:latest"],
    ]
    assert git(repo, "tag") == ""  # a dry run tags nothing


@pytest.mark.parametrize("value", ["true", "yes", "TRUE", "on"])
def test_dry_run_spelled_as_a_word_is_a_dry_run(repo: Path, docker: Path, value: str) -> None:
    path = f"{docker}{os.pathsep}{os.environ['PATH']}"
    result = release(repo, "v1.2.3", DRY_RUN=value, PATH=path)
    assert result.returncode == 0, result.stderr
    assert ["docker", "push", f"{IMAGE}:v1.2.3"] in commands(result.stdout)
    assert (
        docker_calls(docker) == []
        and git(repo, "tag") == ""
        and remote_tags(repo.parent / "remote.git") == []
    )


@pytest.mark.parametrize("value", ["2", "dry", "y es"])
def test_an_unknown_dry_run_value_is_refused(repo: Path, docker: Path, value: str) -> None:
    path = f"{docker}{os.pathsep}{os.environ['PATH']}"
    result = release(repo, "v1.2.3", DRY_RUN=value, PATH=path)
    assert result.returncode == 2 and "DRY_RUN" in result.stderr
    assert docker_calls(docker) == [] and git(repo, "tag") == ""


def test_a_real_release_pushes_the_git_tag_before_any_image(repo: Path, remote: Path, docker: Path) -> None:
    path = f"{docker}{os.pathsep}{os.environ['PATH']}"
    result = release(repo, "v1.2.3", DRY_RUN="0", PATH=path)
    assert result.returncode == 0, result.stderr
    assert git(repo, "tag") == "v1.2.3" and remote_tags(remote) == ["v1.2.3"]
    assert git(remote, "rev-parse", "v1.2.3^{commit}") == git(repo, "rev-parse", "HEAD")
    calls = docker_calls(docker)
    assert calls[0] == ["tools/dist.sh", "dist/v1.2.3"]
    assert [c[:2] for c in calls[1:]] == [["docker", "build"], ["docker", "push"], ["docker", "push"]]
    assert [c[2] for c in calls[2:]] == [f"{IMAGE}:v1.2.3", f"{IMAGE}:latest"]
    # Uploading to the package index is left to the person releasing, told how at the end.
    assert result.stderr.splitlines()[-1].endswith("twine upload dist/v1.2.3/*")


def test_a_failed_build_takes_the_local_tag_back_and_pushes_nothing(
    repo: Path, remote: Path, docker: Path
) -> None:
    (docker / "fail").touch()
    path = f"{docker}{os.pathsep}{os.environ['PATH']}"
    result = release(repo, "v1.2.3", DRY_RUN="", PATH=path)
    assert result.returncode != 0
    assert "local tag v1.2.3 removed" in result.stderr
    assert git(repo, "tag") == "" and remote_tags(remote) == []
    assert [c[:2] for c in docker_calls(docker)] == [["tools/dist.sh", "dist/v1.2.3"], ["docker", "build"]]


def test_a_failed_dist_build_takes_the_local_tag_back_and_builds_no_image(
    repo: Path, remote: Path, docker: Path
) -> None:
    (docker / "dist-fail").touch()
    path = f"{docker}{os.pathsep}{os.environ['PATH']}"
    result = release(repo, "v1.2.3", DRY_RUN="0", PATH=path)
    assert result.returncode != 0
    assert "local tag v1.2.3 removed" in result.stderr
    assert git(repo, "tag") == "" and remote_tags(remote) == []
    assert docker_calls(docker) == [["tools/dist.sh", "dist/v1.2.3"]]


def test_a_tag_only_on_the_remote_is_refused(repo: Path, remote: Path, docker: Path) -> None:
    git(repo, "tag", "v1.2.3")
    git(repo, "push", "-q", "origin", "v1.2.3")
    git(repo, "tag", "--delete", "v1.2.3")  # as if someone else released it
    assert git(repo, "tag") == ""
    path = f"{docker}{os.pathsep}{os.environ['PATH']}"
    result = release(repo, "v1.2.3", DRY_RUN="0", PATH=path)
    assert result.returncode == 1 and "already exists on remote 'origin'" in result.stderr
    assert docker_calls(docker) == [] and git(repo, "tag") == ""


def test_an_unreachable_remote_is_refused(repo: Path, tmp_path: Path) -> None:
    result = release(repo, "v1.2.3", REMOTE=str(tmp_path / "nowhere.git"))
    assert result.returncode == 1 and "cannot list the tags" in result.stderr
    assert commands(result.stdout) == []


@pytest.mark.parametrize("version", ["v1.2.4", "v0.1.0"])
def test_a_version_other_than_pyprojects_is_refused(repo: Path, version: str) -> None:
    result = release(repo, version)
    assert result.returncode == 1
    assert "pyproject.toml" in result.stderr and "'1.2.3'" in result.stderr  # not [tool.other]'s 9.9.9
    assert commands(result.stdout) == []


def test_latest_does_not_move_back_to_an_older_version(repo: Path, remote: Path) -> None:
    set_version(repo, "1.10.0")
    git(repo, "tag", "v1.10.0")
    git(repo, "push", "-q", "origin", "v1.10.0")
    git(repo, "tag", "--delete", "v1.10.0")  # only on the remote now
    set_version(repo, "1.9.1")  # a patch release of an older line; 1.9 < 1.10 numerically
    result = release(repo, "v1.9.1")
    assert result.returncode == 0, result.stderr
    printed = commands(result.stdout)
    build = next(c for c in printed if c[:2] == ["docker", "build"])
    assert [build[i + 1] for i, arg in enumerate(build) if arg == "--tag"] == [f"{IMAGE}:v1.9.1"]
    assert ["docker", "push", f"{IMAGE}:latest"] not in printed
    assert "older than v1.10.0" in result.stderr


def test_latest_moves_for_a_newer_version(repo: Path) -> None:
    git(repo, "tag", "v1.2.2")
    git(repo, "tag", "v0.99.0")
    result = release(repo, "v1.2.3")
    assert result.returncode == 0, result.stderr
    assert ["docker", "push", f"{IMAGE}:latest"] in commands(result.stdout)


def test_registry_is_overridable(repo: Path) -> None:
    result = release(repo, "v1.2.3", REGISTRY="registry.example.com:5000/team/")
    assert result.returncode == 0, result.stderr
    assert ["docker", "push", "registry.example.com:5000/team/luftpause:v1.2.3"] in commands(result.stdout)


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
