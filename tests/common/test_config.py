"""The configuration: embedded default, files, the environment variables and flags laid over them,
and errors that name the file and the key, or the variable or flag, and the fault."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from luftpause.config import (
    CONFIG_ENV,
    READ_BY,
    Config,
    ConfigError,
    DataplaneConfig,
    listen_url,
    load_config,
    parse_config,
    settings,
)
from luftpause.config.settings import ENV_PREFIX


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
        (
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\nkind = "gpu"\n',
            "replicas[0].kind: expected 'generative' or 'single_pass', got 'gpu'",
        ),
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


REPLICA = '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            REPLICA + 'health_path = "health"\n',
            "replicas[0].health_path: expected '' or a path starting with '/'",
        ),
        (
            REPLICA + 'load_from = ["notaurl"]\n',
            "replicas[0].load_from: expected an http:// or https:// URL, got 'notaurl'",
        ),
        (REPLICA + 'load_from = ["http://e:1", "e:2"]\n', "got 'e:2'"),
        (
            '[scheduler]\nstrict_affinity = "no"\n' + REPLICA,
            "scheduler.strict_affinity: expected true or false, got 'no'",
        ),
        ("[scheduler]\nleases = 0\n" + REPLICA, "scheduler.leases: expected true or false, got 0"),
        (
            '[scheduler]\nidle_affinity = "sticky"\n' + REPLICA,
            "scheduler.idle_affinity: expected 'wait', 'off', 'prefer' or 'pin', got 'sticky'",
        ),
        (
            '[scheduler]\npause_hold = "forever"\n' + REPLICA,
            "scheduler.pause_hold: expected 'cost', 'ttl', 'pause' or 'off', got 'forever'",
        ),
        (
            "[scheduler]\npause_hold_worth = 0\n" + REPLICA,
            "scheduler.pause_hold_worth",
        ),
        (
            '[scheduler]\nresync_hold_s = "2"\n' + REPLICA,
            "scheduler.resync_hold_s: expected a number, got '2'",
        ),
        (
            "[scheduler]\nresync_hold_s = -1\n" + REPLICA,
            "scheduler.resync_hold_s: expected a number >= 0, got -1",
        ),
        (
            '[scheduler]\ndataplane_grace_s = "60"\n' + REPLICA,
            "scheduler.dataplane_grace_s: expected a number, got '60'",
        ),
        (
            REPLICA + 'max_inflight = "4"\n',
            "replicas[0].max_inflight: expected an integer, got '4'",
        ),
        (
            REPLICA + "max_inflight = 4.5\n",
            "replicas[0].max_inflight: expected an integer, got 4.5",
        ),
        (
            REPLICA + "max_inflight = true\n",
            "replicas[0].max_inflight: expected an integer, got true",
        ),
        (
            '[runtime]\nmax_depth = "3"\n' + REPLICA,
            "runtime.max_depth: expected an integer, got '3'",
        ),
        (REPLICA + "api_key_env = 5\n", "replicas[0].api_key_env: expected a string, got 5"),
        (
            REPLICA + 'priority = "fcfs"\n',
            "replicas[0].priority: expected 'lower_first' or 'higher_first', got 'fcfs'",
        ),
        (REPLICA + "priority = 1\n", "replicas[0].priority: expected 'lower_first' or 'higher_first', got 1"),
        (
            REPLICA + 'kind = "single_pass"\npriority = "lower_first"\n',
            "replicas[0].priority: expected only on a generative replica (single-pass turns are sent "
            "unchanged), got 'lower_first' with kind 'single_pass'",
        ),
        (REPLICA + 'models = "m"\n', "not valid TOML"),
        (
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = "m"\n',
            "replicas[0].models: expected an array, got 'm'",
        ),
        ("replicas = []\n", "replicas: expected an array of at least 1 item, got []"),
        (
            '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = []\n',
            "replicas[0].models: expected an array of at least 1 item, got []",
        ),
        (
            '[[replicas]]\nname = ""\nurl = "http://x"\nmodels = ["m"]\n',
            "replicas[0].name: expected a non-empty string, got ''",
        ),
        (REPLICA + "max_inflight = 0\n", "replicas[0].max_inflight: expected a number >= 1, got 0"),
        ("scheduler = 1\n" + REPLICA, "scheduler: expected a table, got 1"),
        (
            REPLICA + '[[mcp_servers]]\nname = "s"\ncommand = ["x"]\npath_arguments = {t = {p = "run"}}\n',
            "mcp_servers[0].path_arguments.t.p: expected 'read' or 'write', got 'run'",
        ),
        (
            REPLICA + '[[mcp_servers]]\nname = "s"\ncommand = ["x"]\nenv = {A = 1}\n',
            "mcp_servers[0].env.A: expected a string, got 1",
        ),
    ],
)
def test_values_of_the_wrong_type_or_shape_are_refused_not_coerced(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "bad.toml")
    assert str(caught.value).startswith("bad.toml: ")
    assert expected in str(caught.value)


def test_priority_on_a_single_pass_replica_is_named_like_every_other_key() -> None:
    # It read "replicas[3]: priority: expected ..." while every other error reads "replicas[1].key: ...".
    replicas = "".join(f'[[replicas]]\nname = "r{i}"\nurl = "http://x"\nmodels = ["m"]\n' for i in range(3))
    text = replicas + '[[replicas]]\nname = "c"\nurl = "http://y"\nmodels = ["c"]\nkind = "single_pass"\n'
    with pytest.raises(ConfigError) as caught:
        parse_config(text + 'priority = "higher_first"\n', "bad.toml")
    assert str(caught.value) == (
        "bad.toml: replicas[3].priority: expected only on a generative replica (single-pass turns are "
        "sent unchanged), got 'higher_first' with kind 'single_pass'"
    )
    # Its kind wrong as well: that error alone, no second one about priority.
    with pytest.raises(ConfigError) as caught:
        parse_config(text.replace("single_pass", "one_pass") + 'priority = "higher_first"\n', "bad.toml")
    assert str(caught.value) == (
        "bad.toml: replicas[3].kind: expected 'generative' or 'single_pass', got 'one_pass'"
    )


@pytest.mark.parametrize("line", ['source = "elsewhere.toml"\n', "colour = 1\n"])
def test_an_unknown_top_level_key_is_refused(line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(line + REPLICA, "bad.toml")
    assert str(caught.value) == f"bad.toml: {line.split()[0]}: unknown key"


def test_no_message_keeps_pydantics_wording() -> None:
    for text in (
        '[scheduler]\nleases = "yes"\n' + REPLICA,
        '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = "m"\n',
    ):
        with pytest.raises(ConfigError) as caught:
            parse_config(text, "bad.toml")
        assert "Input should" not in str(caught.value) and "tuple" not in str(caught.value).lower()


def test_strict_types_still_take_what_toml_writes_naturally() -> None:
    config = parse_config(
        "[scheduler]\ndataplane_grace_s = 2\nresync_hold_s = 0\nstrict_affinity = false\n"
        + REPLICA
        + 'health_path = ""\nload_from = ["https://e1:9/", "http://e2:9"]\n'
        + '[[mcp_servers]]\nname = "s"\nurl = "http://m"\npath_arguments = {t = ["p"], u = {p = "read"}}\n',
        "ok.toml",
    )
    assert config.scheduler.dataplane_grace_s == 2.0 and config.scheduler.resync_hold_s == 0.0
    assert config.scheduler.strict_affinity is False
    assert config.scheduler.idle_affinity == "wait"  # the default
    assert (config.scheduler.pause_hold, config.scheduler.pause_hold_worth) == ("cost", 8.0)
    assert config.replicas[0].health_path == ""
    assert config.replicas[0].load_from == ("https://e1:9", "http://e2:9")
    assert config.mcp_servers[0].path_arguments == {"t": ("p",), "u": {"p": "read"}}


def test_the_startup_hold_defaults_to_two_seconds() -> None:
    assert parse_config(REPLICA, "f.toml").scheduler.resync_hold_s == 2.0


def test_a_listen_address_is_reached_on_its_host_or_on_loopback_for_all_addresses() -> None:
    assert listen_url("0.0.0.0:7000") == "http://127.0.0.1:7000"
    assert listen_url("[::]:7000") == "http://[::1]:7000"
    assert listen_url("[::1]:7000") == "http://[::1]:7000"
    assert listen_url("10.0.0.5:7001") == "http://10.0.0.5:7001"


def test_a_replica_sends_no_priority_unless_its_engine_order_is_named() -> None:
    assert parse_config(REPLICA).replicas[0].priority is None
    for order in ("lower_first", "higher_first"):
        assert parse_config(REPLICA + f'priority = "{order}"\n').replicas[0].priority == order


# -- environment variables and flags over the file (luftpause.config.settings) ----------------------------

FILE_WITH_LISTEN = '[dataplane]\nlisten = "127.0.0.1:1001"\n' + REPLICA
LISTEN_FLAG = {("dataplane", "listen"): ("--listen", "127.0.0.1:1003")}


@pytest.fixture
def no_settings_in_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No ``LUFTPAUSE_*`` variable of the caller's shell leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lp.toml"
    path.write_text(text)
    return path


def test_a_flag_beats_its_variable_which_beats_the_file_which_beats_the_default(
    tmp_path: Path, no_settings_in_env: pytest.MonkeyPatch
) -> None:
    with_key, without_key = _file(tmp_path, FILE_WITH_LISTEN), tmp_path / "bare.toml"
    without_key.write_text(REPLICA)
    no_settings_in_env.setenv("LUFTPAUSE_DATAPLANE__LISTEN", "127.0.0.1:1002")
    assert load_config(with_key, LISTEN_FLAG).dataplane.listen == "127.0.0.1:1003"
    assert load_config(with_key).dataplane.listen == "127.0.0.1:1002"
    no_settings_in_env.delenv("LUFTPAUSE_DATAPLANE__LISTEN")
    assert load_config(with_key).dataplane.listen == "127.0.0.1:1001"
    assert load_config(without_key).dataplane.listen == DataplaneConfig().listen


def test_the_embedded_default_takes_variables_too(no_settings_in_env: pytest.MonkeyPatch) -> None:
    no_settings_in_env.setenv("LUFTPAUSE_RUNTIME__LISTEN", "0.0.0.0:1004")
    config = load_config()
    assert config.is_embedded_default and config.runtime.listen == "0.0.0.0:1004"


def test_a_variable_is_read_as_its_key_s_type(no_settings_in_env: pytest.MonkeyPatch) -> None:
    for name, text in {
        "LUFTPAUSE_SCHEDULER__STRICT_AFFINITY": "false",
        "LUFTPAUSE_SCHEDULER__LEASES": "0",
        "LUFTPAUSE_SCHEDULER__DATAPLANE_GRACE_S": "2.5",
        "LUFTPAUSE_SCHEDULER__RESYNC_HOLD_S": "3",
        "LUFTPAUSE_RUNTIME__MAX_DEPTH": "5",
        "luftpause_runtime__workspace": "/srv/work",  # lower case is read too
    }.items():
        no_settings_in_env.setenv(name, text)
    config = load_config()
    assert config.scheduler.strict_affinity is False and config.scheduler.leases is False
    assert config.scheduler.dataplane_grace_s == 2.5 and config.scheduler.resync_hold_s == 3.0
    assert config.runtime.max_depth == 5 and config.runtime.workspace == "/srv/work"


def test_an_empty_variable_counts_as_unset(tmp_path: Path, no_settings_in_env: pytest.MonkeyPatch) -> None:
    no_settings_in_env.setenv("LUFTPAUSE_DATAPLANE__LISTEN", "")
    assert load_config(_file(tmp_path, FILE_WITH_LISTEN)).dataplane.listen == "127.0.0.1:1001"


def test_a_whole_table_may_be_one_json_variable_and_its_key_variables_win(
    no_settings_in_env: pytest.MonkeyPatch,
) -> None:
    no_settings_in_env.setenv("LUFTPAUSE_RUNTIME", '{"max_children": 2, "listen": "127.0.0.1:1005"}')
    no_settings_in_env.setenv("LUFTPAUSE_RUNTIME__LISTEN", "127.0.0.1:1006")
    config = load_config()
    assert config.runtime.max_children == 2 and config.runtime.listen == "127.0.0.1:1006"


@pytest.mark.parametrize(
    ("variables", "flags", "expected"),
    [
        (
            {"LUFTPAUSE_SCHEDULER__STRICT_AFFINITY": "maybe"},
            {},
            "LUFTPAUSE_SCHEDULER__STRICT_AFFINITY: expected true or false, got 'maybe'",
        ),
        (
            {"LUFTPAUSE_RUNTIME__MAX_DEPTH": "0"},
            {},
            "LUFTPAUSE_RUNTIME__MAX_DEPTH: expected a number >= 1, got 0",
        ),
        (
            {"LUFTPAUSE_RUNTIME__MAX_DEPTH": "three"},
            {},
            "LUFTPAUSE_RUNTIME__MAX_DEPTH: expected an integer, got 'three'",
        ),
        (
            {"LUFTPAUSE_DATAPLANE__LISTN": "x"},
            {},
            "LUFTPAUSE_DATAPLANE__LISTN: unknown key (did you mean 'listen'?)",
        ),
        (
            {"LUFTPAUSE_RUNTIME": '{"max_children": 0}'},
            {},
            "LUFTPAUSE_RUNTIME: max_children: expected a number >= 1, got 0",
        ),
        ({"LUFTPAUSE_RUNTIME": "{not json"}, {}, "LUFTPAUSE_RUNTIME: expected a table, got '{not json'"),
        (
            {},
            {("dataplane", "listen"): ("--listen", "8080")},
            "--listen: expected 'host:port', got '8080'",
        ),
        (
            {},
            {("runtime", "dataplane"): ("--dataplane", "127.0.0.1:8080")},
            "--dataplane: expected an http:// or https:// URL, got '127.0.0.1:8080'",
        ),
        (
            {"LUFTPAUSE_DATAPLANE__LISTEN": "127.0.0.1:1"},  # the flag's value is the one checked
            {("dataplane", "listen"): ("--listen", "nope")},
            "--listen: expected 'host:port', got 'nope'",
        ),
    ],
)
def test_a_bad_variable_or_flag_is_refused_naming_it_and_what_was_expected(
    variables: dict[str, str],
    flags: dict[tuple[str, ...], tuple[str, str]],
    expected: str,
    no_settings_in_env: pytest.MonkeyPatch,
) -> None:
    for name, text in variables.items():
        no_settings_in_env.setenv(name, text)
    with pytest.raises(ConfigError) as caught:
        load_config(None, flags)
    assert str(caught.value) == expected


def test_faults_of_the_file_and_of_a_variable_are_each_named_by_their_source(
    tmp_path: Path, no_settings_in_env: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path, "[runtime]\nmax_children = 0\n" + REPLICA)
    no_settings_in_env.setenv("LUFTPAUSE_SCHEDULER__LEASES", "sometimes")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {("scheduler", "http"): ("--http", "x")})
    assert str(caught.value) == (
        f"{path}: runtime.max_children: expected a number >= 1, got 0; "
        "--http: expected 'host:port', got 'x'; "
        "LUFTPAUSE_SCHEDULER__LEASES: expected true or false, got 'sometimes'"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "LUFTPAUSE_REPLICAS__0__URL",
            "LUFTPAUSE_REPLICAS__0__URL: [[replicas]] is set in the configuration file only",
        ),
        ("LUFTPAUSE_REPLICAS", "LUFTPAUSE_REPLICAS: [[replicas]] is set in the configuration file only"),
        ("LUFTPAUSE_MCP_SERVERS__FAKE__URL", "LUFTPAUSE_MCP_SERVERS__FAKE__URL: [[mcp_servers]] is set in"),
        (
            "LUFTPAUSE_DATAPLAN__LISTEN",
            "LUFTPAUSE_DATAPLAN__LISTEN: no table 'dataplan' to override; expected "
            "LUFTPAUSE_<TABLE>__<KEY> with TABLE one of SCHEDULER, DATAPLANE, RUNTIME",
        ),
    ],
)
def test_a_variable_naming_an_array_of_tables_or_no_table_is_refused(
    name: str, expected: str, no_settings_in_env: pytest.MonkeyPatch
) -> None:
    no_settings_in_env.setenv(name, "http://127.0.0.1:1")
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert str(caught.value).startswith(expected)


def test_luftpause_variables_that_are_not_settings_are_left_alone(
    no_settings_in_env: pytest.MonkeyPatch,
) -> None:
    for name in ("LUFTPAUSE_TOKEN", "LUFTPAUSE_LOG_LEVEL", "LUFTPAUSE_NO_EXTENSIONS", "LUFTPAUSE_MODEL"):
        no_settings_in_env.setenv(name, "x")
    assert load_config().is_embedded_default


class _AddedTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)
    probe_s: float = 2.0
    """Seconds between probes."""


class _Grown(BaseModel):
    """A configuration grown by a table, as another branch may grow :class:`Config`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    dataplane: DataplaneConfig = DataplaneConfig()
    added: _AddedTable = _AddedTable()


def test_a_key_added_to_the_model_gets_its_variable_and_help_line_with_no_other_change(
    no_settings_in_env: pytest.MonkeyPatch,
) -> None:
    no_settings_in_env.setenv("LUFTPAUSE_ADDED__PROBE_S", "0.5")
    layer = settings.from_environment(_Grown)
    assert layer.values == {"added": {"probe_s": 0.5}}
    assert _Grown.model_validate(layer.values).added.probe_s == 0.5
    shown = settings.help_text(_Grown, ["added"], {})
    assert "[added]\n  probe_s = 2.0  $LUFTPAUSE_ADDED__PROBE_S\n      Seconds between probes." in shown


def test_every_key_has_a_description_for_the_help() -> None:
    models = [*settings.tables(Config).values(), *settings.arrays_of_tables(Config).values()]
    assert len(models) == 5
    missing = [
        f"{m.__name__}.{k}" for m in models for k, info in m.model_fields.items() if not info.description
    ]
    assert missing == []


def test_every_part_of_the_configuration_is_read_by_some_process() -> None:
    """A table another branch adds must say which processes read it (their --help lists it)."""
    read = {part.split(".")[0] for parts in READ_BY.values() for part in parts}
    assert read == set(Config.model_fields) - {"source"}
    for parts in READ_BY.values():
        settings.help_text(Config, parts, {})  # every part names a table, an array or a key
