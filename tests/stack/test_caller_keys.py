"""Caller keys (:mod:`luftpause.auth.callers`): the issue's "fairness can be spoofed" (one shared
token, and the caller is whatever ``x-luftpause-caller`` the client writes), against a real stack
with a keys file, the ``openai`` client and an MCP client of the runtime, whose own turns carry a
key of their own; and the keys file's parsing, with the errors a bad one is refused with."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from caller_keys_helpers import (
    RUNTIME,
    RUNTIME_KEY,
    RUNTIME_KEY_ENV,
    TEAM_A,
    TEAM_B,
    TEAMS,
    keyed_stack,
    keys_file,
)
from mcp import Client

from luftpause.auth.callers import (
    CALLER_KEYS_ENV,
    Access,
    CallerRefused,
    Identity,
    load_caller_keys,
    parse_keys_env,
    parse_keys_file,
)
from luftpause.config import ConfigError, parse_config
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

TOKEN = "shared-token-of-the-stack"
BATCH_ONLY = "batch-only-key-0123456789ab"
FIXED = "fixed-caller-key-0123456789"

KEYS_FILE = keys_file(
    TEAMS[0],
    {"caller": "team-b", "key_sha256": hashlib.sha256(TEAM_B.encode()).hexdigest()},
    {"caller": "nightly", "key": BATCH_ONLY, "classes": ["batch"]},
    {"caller": "fixed", "key": FIXED, "narrow": False},
    RUNTIME,
)


# --- the keys file and the rules, in-process -----------------------------------------------------


def _config(keys_path: Path | None = None) -> Any:
    line = f'caller_keys = "{keys_path}"\n' if keys_path else ""
    return parse_config(
        f'[dataplane]\n{line}[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n', "lp.toml"
    )


def test_every_way_of_giving_a_key_identifies_its_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RUNTIME_KEY_ENV, RUNTIME_KEY)
    monkeypatch.delenv(CALLER_KEYS_ENV, raising=False)
    path = tmp_path / "callers.toml"
    path.write_text(KEYS_FILE)
    keys = load_caller_keys(_config(path))
    assert keys is not None and len(keys) == 5
    for key, caller in [
        (TEAM_A, "team-a"),
        (TEAM_B, "team-b"),
        (BATCH_ONLY, "nightly"),
        (RUNTIME_KEY, "runtime"),
    ]:
        identity = keys.identify(f"Bearer {key}")
        assert identity is not None and identity.caller == caller
        assert keys.identify(f"bearer {key}".encode()) == identity  # the scheme is case-insensitive
    for wrong in (None, "", "Bearer", f"Basic {TEAM_A}", f"Bearer {TEAM_A}x", f"Bearer {TOKEN}"):
        assert keys.identify(wrong) is None


def test_no_keys_anywhere_is_the_shared_token_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CALLER_KEYS_ENV, raising=False)
    assert load_caller_keys(_config()) is None
    access = Access(TOKEN, None)
    assert access.allows(f"Bearer {TOKEN}") and not access.allows(None) and not access.allows("Bearer nope")
    assert access.resolve(f"Bearer {TOKEN}", None, "whoever-i-say") == ("interactive", "whoever-i-say")
    assert Access(None, None).allows(None)


def test_keys_from_the_environment_add_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "callers.toml"
    path.write_text(f'[[keys]]\ncaller = "team-a"\nkey = "{TEAM_A}"\n')
    monkeypatch.setenv("OTHER_KEY", "other-key-0123456789abcdef")
    monkeypatch.setenv(CALLER_KEYS_ENV, orjson.dumps([{"caller": "other", "key_env": "OTHER_KEY"}]).decode())
    keys = load_caller_keys(_config(path))
    assert keys is not None and len(keys) == 2
    assert keys.identify("Bearer other-key-0123456789abcdef") == Identity("other", ("interactive", "batch"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[[keys]]\ncaller = "a b"\nkey = "0123456789abcdef"\n',
            "keys[0].caller: expected 1 to 64 printable ASCII",
        ),
        (f'[[keys]]\ncaller = "{"x" * 65}"\nkey = "0123456789abcdef"\n', "keys[0].caller: expected 1 to 64"),
        ('[[keys]]\ncaller = "a"\n', "keys[0]: expected exactly one of 'key', 'key_env' or 'key_sha256'"),
        (
            '[[keys]]\ncaller = "a"\nkey = "0123456789abcdef"\nkey_env = "X"\n',
            "keys[0]: expected exactly one of",
        ),
        ('[[keys]]\ncaller = "a"\nkey = "short"\n', "keys[0]: expected a key of at least 16 characters"),
        (
            '[[keys]]\ncaller = "a"\nkey_env = "LUFTPAUSE_TEST_UNSET_KEY"\n',
            "LUFTPAUSE_TEST_UNSET_KEY is not set",
        ),
        (
            '[[keys]]\ncaller = "a"\nkey_sha256 = "abc"\n',
            "keys[0].key_sha256: expected 64 hexadecimal digits",
        ),
        (
            '[[keys]]\ncaller = "a"\nkey = "0123456789abcdef"\nclasses = ["gold"]\n',
            "keys[0].classes[0]: expected",
        ),
        (
            '[[keys]]\ncaller = "a"\nkey = "0123456789abcdef"\nclasses = []\n',
            "keys[0].classes: expected an array of at least 1",
        ),
        ('[[keys]]\ncaller = "a"\nkey = "0123456789abcdef"\nrole = "admin"\n', "keys[0].role: unknown key"),
        ("keys = [", "not valid TOML"),
        ("", "keys: expected a value"),
    ],
)
def test_a_bad_keys_file_is_refused_naming_the_file_the_entry_and_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_keys_file(text, "callers.toml")
    assert str(caught.value).startswith("callers.toml: ")
    assert expected in str(caught.value)


def test_one_key_given_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CALLER_KEYS_ENV, raising=False)
    path = tmp_path / "callers.toml"
    digest = hashlib.sha256(TEAM_A.encode()).hexdigest()
    path.write_text(
        f'[[keys]]\ncaller = "a"\nkey = "{TEAM_A}"\n[[keys]]\ncaller = "b"\nkey_sha256 = "{digest}"\n'
    )
    with pytest.raises(ConfigError, match=r"one key is given twice \(callers 'a' and 'b'\)"):
        load_caller_keys(_config(path))


def test_a_bad_environment_variable_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=rf"\${CALLER_KEYS_ENV}: not valid JSON"):
        parse_keys_env("[{")
    with pytest.raises(ConfigError, match=rf"\${CALLER_KEYS_ENV}: expected a JSON array"):
        parse_keys_env('{"caller": "a"}')
    with pytest.raises(ConfigError, match=rf"\${CALLER_KEYS_ENV}: keys\[0\]\.caller: expected a value"):
        parse_keys_env('[{"key": "0123456789abcdef"}]')


@pytest.mark.parametrize(
    ("header", "caller"),
    [
        (None, "team-a"),
        ("", "team-a"),
        ("team-a", "team-a"),
        ("team-a/job-7", "team-a/job-7"),
        ("job-7", "team-a/job-7"),
        ("team-b", "team-a/team-b"),  # another key's caller: put below this key, never taken
        ("team-ab", "team-a/team-ab"),  # a longer name is not below team-a
        ("team-a/", "team-a/"),
    ],
)
def test_the_caller_header_only_narrows_the_keys_caller(header: str | None, caller: str) -> None:
    assert Identity("team-a", ("interactive", "batch")).caller_for(header) == caller


def test_a_key_that_may_not_narrow_ignores_the_header() -> None:
    assert Identity("fixed", ("interactive",), narrow=False).caller_for("fixed/job") == "fixed"


def test_a_key_uses_only_its_classes_and_its_first_is_the_default() -> None:
    nightly = Identity("nightly", ("batch",))
    assert nightly.service_class(None) == "batch"
    assert nightly.service_class("batch") == "batch"
    with pytest.raises(CallerRefused) as caught:
        nightly.service_class("interactive")
    assert caught.value.status == 403
    assert "may not send 'interactive' turns" in str(caught.value)


# --- a real stack with caller keys -------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with keyed_stack(tmp_path_factory.mktemp("keys"), KEYS_FILE, token=TOKEN, runtime_key=True) as stack:
        yield stack


def _client(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key=key, max_retries=0)


def _turn(stack: Stack, key: str, **headers: str) -> Any:
    with _client(stack, key) as client:
        return client.chat.completions.create(
            model=stack.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            extra_headers={"x-luftpause-run-id": f"keys-{uuid.uuid4().hex[:8]}", **headers},
        )


def _callers(stack: Stack) -> dict[str, int]:
    by_caller: dict[str, int] = stack.status()["runs_by_caller"]
    return by_caller


def test_a_clients_caller_is_its_keys_and_the_header_cannot_claim_another(keyed: Stack) -> None:
    tag = uuid.uuid4().hex[:6]
    _turn(keyed, TEAM_A, **{"x-luftpause-caller": "team-b"})  # the spoof of the issue
    _turn(keyed, TEAM_A, **{"x-luftpause-caller": f"team-a/job-{tag}"})
    _turn(keyed, TEAM_B)
    callers = _callers(keyed)
    assert callers.get("team-a/team-b") == 1
    assert callers.get(f"team-a/job-{tag}") == 1
    assert callers.get("team-b") == 1, callers  # only team-b's own turn counts as team-b


def test_a_key_sent_as_x_api_key_is_taken_as_the_anthropic_clients_send_it(keyed: Stack) -> None:
    tag = uuid.uuid4().hex[:6]
    body = {"model": keyed.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"x-api-key": TEAM_B, "x-luftpause-caller": f"team-b/x-{tag}", "x-luftpause-run-id": f"x-{tag}"}
    answered = httpx.post(
        f"{keyed.dataplane_url}/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert answered.status_code == 200, answered.text
    assert _callers(keyed).get(f"team-b/x-{tag}") == 1


def test_a_key_that_may_not_narrow_is_always_its_caller(keyed: Stack) -> None:
    before = _callers(keyed).get("fixed", 0)
    _turn(keyed, FIXED, **{"x-luftpause-caller": "somebody-else"})
    callers = _callers(keyed)
    assert callers.get("fixed") == before + 1
    assert not any("somebody-else" in caller for caller in callers)


def test_the_shared_token_or_an_unknown_key_is_refused_401_once_keys_are_configured(keyed: Stack) -> None:
    refusal = {
        "error": {"message": "missing or unknown caller key (Authorization: Bearer <your key>, or x-api-key)"}
    }
    for key in (TOKEN, "not-a-configured-key-0000"):
        with pytest.raises(openai.AuthenticationError) as caught:
            _turn(keyed, key)
        assert caught.value.response.json() == refusal
        assert caught.value.response.headers["www-authenticate"] == 'Bearer realm="luftpause"'
    body = {"model": keyed.model, "messages": [{"role": "user", "content": "hi"}]}
    keyless = httpx.post(f"{keyed.dataplane_url}/v1/chat/completions", json=body)
    assert (keyless.status_code, keyless.json()) == (401, refusal)
    with _client(keyed, TOKEN) as client, pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_a_class_the_key_may_not_use_is_refused_403_and_its_first_class_is_the_default(keyed: Stack) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        _turn(keyed, BATCH_ONLY, **{"x-luftpause-class": "interactive"})
    message = "the key of caller 'nightly' may not send 'interactive' turns (x-luftpause-class may be: batch)"
    assert caught.value.response.json() == {"error": {"message": message}}
    before = keyed.status()["runs_by_class"]["batch"]
    _turn(keyed, BATCH_ONLY)  # no class header: the key's first class, batch
    assert keyed.status()["runs_by_class"]["batch"] == before + 1
    # A class that is no class at all is still a 400 first.
    with pytest.raises(openai.BadRequestError):
        _turn(keyed, BATCH_ONLY, **{"x-luftpause-class": "gold"})


def test_every_v1_route_takes_a_key(keyed: Stack) -> None:
    with _client(keyed, TEAM_A) as client:
        assert [m.id for m in client.models.list().data] == [keyed.model]
    ended = httpx.delete(
        f"{keyed.dataplane_url}/v1/runs/keys-ended", headers={"authorization": f"Bearer {TEAM_B}"}
    )
    assert ended.status_code == 204
    refused = httpx.delete(
        f"{keyed.dataplane_url}/v1/runs/keys-ended", headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert refused.status_code == 401


def test_the_runtimes_own_turns_carry_its_key_and_its_mcp_callers_below_it(keyed: Stack) -> None:
    """A sub-agent's run, held on an approval after its first turn (so the scheduler still has it;
    a finished run is ended there), is a caller below the runtime's key; then it is declined and
    completes, through the same key."""

    async def go() -> tuple[dict[str, Any], dict[str, int], dict[str, Any]]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        # With caller keys the runtime takes them too (docs/security-tenants.md), not the shared token.
        headers = {"Authorization": f"Bearer {TEAM_A}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
            async with Client(streamable_http_client(keyed.runtime_url, http_client=http)) as client:
                task = {
                    "task": "look it up",
                    "tools": ["lookup"],
                    "approveTools": ["lookup"],
                    "maxToolCalls": 1,
                }
                handle = (await client.call_tool("spawn", task)).structured_content["handle"]
                waiting = await client.call_tool("await", {"handles": [handle], "timeout": 120})
                callers = _callers(keyed)
                await client.call_tool("approve", {"handle": handle, "allow": False})
                done = await client.call_tool("await", {"handles": [handle], "timeout": 120})
                return waiting.structured_content["runs"][0], callers, done.structured_content["runs"][0]

    waiting, callers, done = asyncio.run(go())
    assert waiting["state"] == "AwaitingApproval", waiting
    runtime_callers = [caller for caller in callers if caller.startswith("runtime")]
    assert runtime_callers and all(caller.startswith("runtime/") for caller in runtime_callers), callers
    assert done["state"] == "completed", done


def test_a_bad_keys_file_stops_the_dataplane_at_start_naming_it(tmp_path: Path) -> None:
    keys = tmp_path / "callers.toml"
    keys.write_text('[[keys]]\ncaller = "a"\nkey = "short"\n')
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[dataplane]\nlisten = "127.0.0.1:{free_port()}"\nscheduler = "127.0.0.1:{free_port()}"\n'
        f'caller_keys = "{keys}"\n'
        f'[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:{free_port()}"\nmodels = ["m"]\n'
    )
    child = ChildProcess("dataplane", ["dataplane", "--config", str(config)], tmp_path / "dp.log")
    child.start()
    assert child.proc is not None
    assert child.proc.wait(timeout=120) == 2
    assert (
        f"luftpause dataplane: {keys}: keys[0]: expected a key of at least 16 characters" in child.log_tail()
    )


def test_keys_are_never_kept_in_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CALLER_KEYS_ENV, raising=False)
    path = tmp_path / "callers.toml"
    path.write_text(f'[[keys]]\ncaller = "team-a"\nkey = "{TEAM_A}"\n')
    keys = load_caller_keys(_config(path))
    assert keys is not None
    assert TEAM_A not in repr(vars(keys))
