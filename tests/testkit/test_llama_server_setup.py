"""``luftpause.testkit.launch.llama_server``'s set-up steps that need no build: the model download has a
lock of its own (a build in progress does not hold it up), the tools chat template is found where
the build copies it (or where the environment names it), and a replica given a template starts
with it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from luftpause.testkit.launch import llama_server

FAILSAFE_S = 60.0  # a thread still blocked after this is deadlocked, never a measured bound


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(llama_server.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(llama_server.TEMPLATE_ENV, raising=False)
    return tmp_path


def test_the_model_step_does_not_wait_for_a_build_in_progress(cache: Path) -> None:
    model = cache / "model" / llama_server.MODEL_FILE
    model.parent.mkdir(parents=True)
    model.write_bytes(b"GGUF")  # already fetched: the step only takes its lock and returns
    found: list[Path] = []
    with llama_server.locked(cache):  # a build holds the cache folder's lock
        fetch = threading.Thread(target=lambda: found.append(llama_server.fetch_model()), daemon=True)
        fetch.start()
        fetch.join(FAILSAFE_S)
        assert not fetch.is_alive(), "the model step waited for the build's lock"
    assert found == [model]


def test_the_tools_template_is_copied_from_the_tree_and_found_there(cache: Path, tmp_path: Path) -> None:
    assert llama_server.tools_template() is None
    assert "LUFTPAUSE_LLAMA_TOOLS_TEMPLATE" in llama_server.missing_template()
    built = cache / "bin" / "llama-server"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")  # already built: the step only copies the template from the tree
    sdist = tmp_path / "sdist"
    shipped = sdist / "vendor" / "llama.cpp" / "models" / "templates" / llama_server.TOOLS_TEMPLATE
    shipped.parent.mkdir(parents=True)
    shipped.write_text("{{ '<tool_call>' }}")
    assert llama_server.build(source=sdist) == built
    assert llama_server.tools_template() == cache / "templates" / llama_server.TOOLS_TEMPLATE
    assert llama_server.tools_template().read_text() == "{{ '<tool_call>' }}"  # type: ignore[union-attr]


def test_a_named_template_wins_and_a_replica_starts_with_it(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    named = tmp_path / "mine.jinja"
    named.write_text("x")
    monkeypatch.setenv(llama_server.TEMPLATE_ENV, str(named))
    assert llama_server.tools_template() == named
    installed = llama_server.Installed(Path("/opt/llama-server"), Path("/opt/model.gguf"))
    plain = llama_server.replica_argv(installed, 8080)
    assert "--chat-template-file" not in plain and "--jinja" in plain
    options = llama_server.ReplicaOptions(parallel=4, chat_template=named)
    argv = llama_server.replica_argv(installed, 8080, options)
    assert argv[argv.index("--chat-template-file") + 1] == str(named)
    assert argv[argv.index("--parallel") + 1] == "4"
