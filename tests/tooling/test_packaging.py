"""What a package index and a user get: ``tools/dist.sh``'s sdist and manylinux wheel, and the sdist
installed into a fresh venv serving a streamed turn.

Marked ``packaging`` (``-m packaging`` selects them, ``-m "not packaging"`` leaves them out): the
module builds the sdist and wheel once (``tools/dist.sh``: ``python -m build``, ``auditwheel
repair``, ``twine check``) and installs the sdist once, without extras, into a fresh venv (pip's
own cache and the package index, nothing else), which builds the C extensions again from the
sdist's ``.pyx``; about two minutes on this machine. The other tests use the two results.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import openai
import pytest
from repo_paths import ROOT

from luftpause import __version__
from luftpause.config import load_config
from luftpause.testkit.launch.procs import free_port

DIST = ROOT / "tools" / "dist.sh"
NAME = f"luftpause-{__version__}"

pytestmark = [pytest.mark.packaging, pytest.mark.integration]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tools/dist.sh OUTDIR`` run once with this venv's Python; OUTDIR."""
    out = tmp_path_factory.mktemp("dist") / "out"
    done = subprocess.run(
        ["bash", str(DIST), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


def the_wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("*.whl")
    return wheel


def the_sdist(dist: Path) -> Path:
    (sdist,) = dist.glob("*.tar.gz")
    return sdist


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the sdist installed, no extras; its directory."""
    path = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    done = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", str(the_sdist(dist))],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "LUFTPAUSE_NO_EXTENSIONS"},
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return path


def run_in(venv: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``VENV/bin/ARGV[0] ARGV[1:]`` (``env``: its whole environment, default this one's), from a
    directory outside the checkout (so nothing imports the tree's ``luftpause`` instead of the
    installed one)."""
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        cwd=venv,
        env=env,
        timeout=120,
    )


# --- the files an index takes -------------------------------------------------------------------


def test_the_wheel_is_repaired_to_a_manylinux_tag(dist: Path) -> None:
    wheel = the_wheel(dist)
    tags = wheel.name.removesuffix(".whl").split("-")[-1]
    assert "manylinux" in tags and "linux_x86_64" not in tags.split("."), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        meta = archive.read(f"{NAME}.dist-info/WHEEL").decode()
    assert all("manylinux" in line for line in meta.splitlines() if line.startswith("Tag:")), meta


def test_twine_accepts_both_files(dist: Path) -> None:
    files = [str(the_sdist(dist)), str(the_wheel(dist))]
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2


def test_the_wheel_carries_both_compiled_twins_the_pages_and_the_type_markers(dist: Path) -> None:
    with zipfile.ZipFile(the_wheel(dist)) as archive:
        names = archive.namelist()
    for module in ("dataplane/_sse_c", "tool_calls/_tool_calls_c", "dataplane/apis/_facts_c"):
        assert any(n.startswith(f"luftpause/{module}.") and n.endswith(".so") for n in names), module
    for needed in (
        "luftpause/py.typed",
        "luftpause/v1/scheduler_pb2.pyi",
        "luftpause/scheduler/page.html",
        "luftpause/runtime/web/monitor.html",
        "luftpause/pages/look.html",
        "luftpause/pages/states.html",
    ):
        assert needed in names
    assert not any(n.startswith(("_speedups/", "tests/")) or n.endswith((".pyx", ".c")) for n in names)


def test_the_sdist_carries_the_sources_the_build_needs_and_no_generated_c(dist: Path) -> None:
    with tarfile.open(the_sdist(dist)) as archive:
        names = {n.removeprefix(f"{NAME}/") for n in archive.getnames()}
    for needed in (
        "_speedups/_sse_c.pyx",
        "_speedups/luftpause.dataplane._sse_c.pxd",
        "_speedups/_facts_c.pyx",
        "_speedups/_tool_calls_c.pyx",
        "setup.py",
        "pyproject.toml",
        "README.md",
        "proto/luftpause/v1/scheduler.proto",
        "luftpause/py.typed",
        "luftpause/scheduler/page.html",
        "luftpause/pages/look.html",
        "luftpause/pages/states.html",
    ):
        assert needed in names, needed
    assert not any(n.endswith(".c") or n.endswith(".so") for n in names)
    assert not any(n.startswith("tests/") for n in names)  # they need the whole checkout


def test_dist_refuses_an_outdir_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "old.whl").write_text("")
    done = subprocess.run(["bash", str(DIST), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not empty" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["old.whl"]


# --- the sdist installed in a fresh venv --------------------------------------------------------


def test_the_installed_command_reports_its_version(venv: Path) -> None:
    done = run_in(venv, "luftpause", "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"luftpause {__version__}"


def test_both_compiled_twins_were_built_from_the_sdist_and_are_the_ones_taken(venv: Path) -> None:
    code = (
        "import luftpause.dataplane._sse_c as a, luftpause.tool_calls._tool_calls_c as b\n"
        "import luftpause.dataplane.apis._facts_c as c\n"
        "from luftpause import tool_calls\n"
        "from luftpause.dataplane import sse\n"
        "from luftpause.dataplane.apis import facts\n"
        "print(a.__file__); print(b.__file__); print(c.__file__)\n"
        "print(sse.USING_EXTENSION, tool_calls.USING_EXTENSION, facts.MessagesScanner is c.MessagesScanner)"
    )
    done = run_in(
        venv, "python", "-c", code, env={k: v for k, v in os.environ.items() if "LUFTPAUSE" not in k}
    )
    assert done.returncode == 0, done.stderr
    sse_file, tool_calls_file, facts_file, using = done.stdout.splitlines()
    for file in (sse_file, tool_calls_file, facts_file):
        assert file.startswith(str(venv)) and file.endswith(".so"), file
    assert using == "True True True"


def test_the_core_install_has_no_extra_and_says_which_to_install(venv: Path) -> None:
    measured = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "install_size.py"), str(venv), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    listed = [p["name"].lower() for p in json.loads(measured.stdout)["packages"]]
    # run from the checkout: its luftpause.egg-info must not count as a second luftpause
    assert len(listed) == len(set(listed)), sorted(listed)
    names = set(listed)
    assert "luftpause" in names and "opentelemetry-api" in names
    assert {"rich", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"} & names == set()
    top = run_in(venv, "luftpause", "top")  # live mode draws with rich
    assert top.returncode == 2 and top.stderr.strip().endswith("pip install 'luftpause[tui]'"), top.stderr
    once = run_in(venv, "luftpause", "top", "--once", "--url", "http://127.0.0.1:9")  # draws nothing
    assert once.returncode == 1 and "pip install" not in once.stderr, once.stderr
    traced = run_in(
        venv,
        "luftpause",
        "scheduler",
        "--config",
        str(venv / "absent.toml"),  # were the check to pass, this ends it before it listens
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert traced.returncode == 2 and traced.stderr.strip().endswith("pip install 'luftpause[otel]'")


def _read_until(stream: IO[str], process: subprocess.Popen[str], marker: str, timeout: float = 120.0) -> str:
    """What ``process`` printed to ``stream`` up to the line holding ``marker``; AssertionError with
    all of it when the process ends first or ``timeout`` seconds pass (generous: a loaded machine)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        line = stream.readline()
        if not line or time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} (exit {process.poll()}); it printed:\n{seen}")
        seen += line
    return seen


@pytest.fixture
def up(venv: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The installed ``luftpause up --config FILE --simulate``, FILE being ``up --print-config``
    with every port moved to a free one (docs/operating.md's recipe, "Moving the ports"); (up, the
    dataplane's listen)."""
    text = run_in(venv, "luftpause", "up", "--print-config").stdout
    for default in ("5000", "5001", "8080", "7000", "30001", "30002", "7100"):
        assert f":{default}" in text, default
        text = text.replace(f":{default}", f":{free_port()}")
    path = tmp_path / "moved.toml"
    path.write_text(text.replace('state_dir = "state"', f'state_dir = "{tmp_path / "state"}"'))
    process = subprocess.Popen(
        [str(venv / "bin" / "luftpause"), "up", "--config", str(path), "--simulate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        yield process, load_config(path).dataplane.listen
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_the_installed_stack_streams_a_turn(up: tuple[subprocess.Popen[str], str]) -> None:
    process, listen = up
    assert process.stdout is not None
    printed = _read_until(process.stdout, process, "Ctrl-C stops everything")
    assert f"OpenAI base_url   http://{listen}/v1" in printed
    client = openai.OpenAI(base_url=f"http://{listen}/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="llama-3.2-1b",
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finish == ["stop"], chunks
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 0
