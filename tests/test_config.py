"""The configuration: embedded default, files, and errors that name the file, the key and the fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from luftpause.config import CONFIG_ENV, ConfigError, load_config, parse_config


def test_embedded_default_is_two_simulated_replicas_of_one_model_and_the_fake_mcp_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    config = load_config()
    assert config.is_embedded_default
    assert [r.url for r in config.replicas] == ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    assert len(config.models) == 1
    assert [s.url for s in config.mcp_servers] == ["http://127.0.0.1:7100/mcp"]
    assert config.dataplane.listen == "127.0.0.1:8080"


def test_a_file_named_by_the_environment_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lp.toml"
    path.write_text('[[replicas]]\nname = "a"\nurl = "https://engine.example/"\nmodels = ["m"]\n')
    monkeypatch.setenv(CONFIG_ENV, str(path))
    config = load_config()
    assert config.source == str(path)
    assert config.replica("a").url == "https://engine.example"
    assert config.default_model == "m"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[replicas]]\nname = "a"\nurl = "ftp://x"\nmodels = ["m"]\n', "replicas[0].url: expected an http"),
        ('[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\nkind = "gpu"\n', "replicas[0].kind"),
        (
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\ncolour = 1\n',
            "replicas[0].colour: unknown key",
        ),
        (
            '[dataplane]\nlisten = "8080"\n[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n',
            "dataplane.listen: expected 'host:port'",
        ),
        ('[[replicas]]\nname = "a"\n', "replicas[0].url: expected a value"),
        ("replicas = [", "not valid TOML"),
        (
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n[[replicas]]\nname = "a"\nurl = "http://y"\n'
            'models = ["m"]\n',
            "'a' appears twice",
        ),
        (
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n[[mcp_servers]]\nname = "s"\n',
            "mcp_servers[0]: expected exactly one of 'url' or 'command'",
        ),
        (
            '[runtime]\ndataplane = "127.0.0.1:8080"\n'
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n',
            "runtime.dataplane: expected an http:// or https:// URL",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "bad.toml")
    assert str(caught.value).startswith("bad.toml: ")
    assert expected in str(caught.value)


def test_an_unreadable_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read"):
        load_config(tmp_path / "missing.toml")


def test_a_bad_replica_is_named_without_claiming_the_replica_list_is_empty() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\nmax_inflight = 0\n', "f.toml"
        )
    assert "replicas[0].max_inflight" in str(caught.value)
    assert "at least 1 item" not in str(caught.value)
