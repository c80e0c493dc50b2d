"""What Claude Code and Codex CLI really send, translated: recorded sessions (``tests/data/harnesses``,
made with ``tests/harness_runs.py``; ``docs/harnesses.md`` tells what they show), and the
harnesses themselves run against answers made by the translators when they are installed."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from harness_runs import SESSIONS, harness_bin, record
from repo_paths import DATA

from luftpause.dataplane.apis.errors import TranslationError
from luftpause.dataplane.apis.messages_request import messages_to_chat, tool_result_ids
from luftpause.dataplane.apis.responses_request import call_output_ids, responses_to_chat
from luftpause.dataplane.apis.sessions import harness_session

HARNESSES = DATA / "harnesses"


def recorded(session: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads((HARNESSES / f"{session}.json").read_text())
    return requests


def turns(session: str) -> list[dict[str, Any]]:
    return [
        r
        for r in recorded(session)
        if r["method"] == "POST" and r["path"] in ("/v1/messages", "/v1/responses")
    ]


def as_configured(body: dict[str, Any]) -> dict[str, Any]:
    """A recorded Codex body as Codex sends it configured as docs/harnesses.md says
    (``web_search = "disabled"``: the samples were recorded without, and offer ``web_search``,
    which luftpause refuses)."""
    tools = [t for t in body.get("tools", []) if t.get("type") != "web_search"]
    return {**body, "tools": tools}


def test_codexs_web_search_tool_is_refused_naming_it() -> None:
    (request,) = turns("codex-text")
    position = [t.get("type") for t in request["body"]["tools"]].index("web_search")
    with pytest.raises(TranslationError, match='web_search = "disabled"') as refused:
        responses_to_chat(request["body"])
    assert refused.value.param == f"tools[{position}].type"


def headers(request: dict[str, Any]) -> dict[str, str]:
    return {name.lower(): value for name, value in request["headers"]}


def session_of(request: dict[str, Any], with_headers: bool = True) -> Any:
    given = headers(request) if with_headers else {}
    return harness_session(given.get, request["body"])


@pytest.mark.parametrize("session", sorted(SESSIONS))
def test_every_recorded_turn_translates(session: str) -> None:
    for request in turns(session):
        if request["path"] == "/v1/messages":
            turn = messages_to_chat(request["body"])
            assert turn.stream and turn.body["stream_options"] == {
                "include_usage": True,
                "continuous_usage_stats": True,
            }
            system = turn.body["messages"][0]
            assert system["role"] == "system" and not system["content"].startswith(
                "x-anthropic-billing-header"
            )
        else:
            turn_r = responses_to_chat(as_configured(request["body"]))
            assert turn_r.stream
            names = [t["function"]["name"] for t in turn_r.body["tools"]]
            assert "exec_command" in names and "web_search" not in names


def test_claude_code_routes_and_headers() -> None:
    requests = recorded("claude-text")
    assert [(r["method"], r["path"], r["query"]) for r in requests] == [
        ("HEAD", "/", ""),  # a reachability probe before the first turn
        ("POST", "/v1/messages", "beta=true"),
    ]
    sent = headers(requests[1])
    assert sent["anthropic-version"] == "2023-06-01"
    assert sent["x-api-key"] == "sk-capture"  # ANTHROPIC_API_KEY goes as x-api-key, not Authorization
    assert "authorization" not in sent
    assert (sent["x-luftpause-class"], sent["x-luftpause-caller"]) == ("interactive", "capture")
    assert sent["user-agent"].startswith("claude-cli/2.1.")


def test_claude_codes_tool_round_names_the_tool_use_id_it_was_given() -> None:
    first, second = turns("claude-tool")
    assert "mcp__fake__count_items" in {
        t["function"]["name"] for t in messages_to_chat(first["body"]).body["tools"]
    }
    assert tool_result_ids(second["body"]) == ["toolu_capture0001"]
    chat = messages_to_chat(second["body"]).body["messages"]
    assert chat[-2]["tool_calls"][0]["id"] == "toolu_capture0001"
    assert chat[-1] == {
        "role": "tool",
        "tool_call_id": "toolu_capture0001",
        "content": '{"limit": 3, "type": "int"}',
    }


def test_claude_code_is_one_run_per_agent_with_its_parent() -> None:
    for session in ("claude-text", "claude-tool"):
        runs = {session_of(r).run_id for r in turns(session)}
        assert len(runs) == 1
    main, first_level, second_level, main_again = turns("claude-agent")
    root = session_of(main)
    assert root.run_id.startswith("claude-code:") and root.parent_run_id is None and root.source == "headers"
    assert session_of(main_again) == root
    assert messages_to_chat(main["body"]).thinking and not messages_to_chat(first_level["body"]).thinking
    child = session_of(first_level)
    assert child.run_id.startswith(root.run_id + ":") and child.parent_run_id == root.run_id
    grandchild = session_of(second_level)
    assert grandchild.parent_run_id is not None and grandchild.parent_run_id.startswith(root.run_id + ":")
    assert grandchild.run_id not in (root.run_id, child.run_id)
    # the body knows the session only: without the headers every agent would be the session's run
    assert session_of(first_level, with_headers=False).run_id == root.run_id


def test_codex_routes_headers_and_body_signals() -> None:
    (request,) = recorded("codex-text")
    assert (request["method"], request["path"]) == ("POST", "/v1/responses")
    sent = headers(request)
    assert sent["authorization"] == "Bearer sk-capture"
    assert sent["session-id"] == sent["thread-id"] == sent["x-client-request-id"]
    body = request["body"]
    assert body["prompt_cache_key"] == sent["session-id"] and body["store"] is False
    assert (sent["x-luftpause-class"], sent["x-luftpause-caller"]) == ("interactive", "capture")


def test_codexs_tool_round_and_namespaces() -> None:
    first, second = turns("codex-tool")
    turn = responses_to_chat(as_configured(first["body"]))
    assert turn.tool_names["mcp__fake__count_items"] == ("mcp__fake", "count_items")
    assert call_output_ids(second["body"]) == ["call_capture0001"]
    chat = responses_to_chat(as_configured(second["body"])).body["messages"]
    call = chat[-2]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == ("call_capture0001", "mcp__fake__count_items")
    assert chat[-1]["role"] == "tool" and chat[-1]["tool_call_id"] == "call_capture0001"
    assert session_of(first) == session_of(second)


def test_codex_is_one_run_per_thread() -> None:
    parent_first, parent_again, child = turns("codex-agent")
    root = session_of(parent_first)
    assert root == session_of(parent_again) and root.parent_run_id is None
    sub = session_of(child)
    assert sub.run_id != root.run_id and sub.parent_run_id == root.run_id
    offered = [
        {t["function"]["name"] for t in responses_to_chat(as_configured(r["body"])).body["tools"]}
        for r in (parent_first, child)
    ]
    assert "multi_agent_v1__spawn_agent" in offered[0] and "multi_agent_v1__spawn_agent" not in offered[1]
    assert headers(child)["session-id"] == headers(parent_first)["session-id"]  # the session is the root's
    assert session_of(child, with_headers=False).run_id == f"prompt-cache-key:{headers(child)['session-id']}"


def test_no_signal_is_no_session() -> None:
    assert harness_session(lambda name: None, {"model": "m"}) is None
    assert harness_session({"x-claude-code-session-id": "x" * 101}.get) is None  # too long to be an id


# --- the harnesses themselves ---------------------------------------------------------------------


def _require(name: str) -> None:
    if harness_bin(name) is None:
        pytest.skip(
            f"{name} is not installed: npm install --prefix ~/.cache/luftpause/harnesses "
            "@anthropic-ai/claude-code @openai/codex (or set LUFTPAUSE_HARNESSES_DIR)"
        )
    os.makedirs(os.path.expanduser("~/.cache/luftpause"), exist_ok=True)


@pytest.mark.parametrize("session", ["claude-text", "claude-tool"])
def test_claude_code_takes_translated_answers(session: str) -> None:
    _require("claude")
    run, requests = record(session, translate=True)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["is_error"] is False
    if session == "claude-tool":
        assert result["result"] == 'tool said: {"limit": 3, "type": "int"}'  # it ran the tool on our call
        assert len([r for r in requests if r["path"] == "/v1/messages"]) == 2
    else:
        assert result["result"] == "reply"


@pytest.mark.parametrize("session", ["codex-text", "codex-tool"])
def test_codex_takes_translated_answers(session: str) -> None:
    _require("codex")
    run, requests = record(session, translate=True)
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    if session == "codex-tool":
        calls = [
            e["item"]
            for e in events
            if e.get("type") == "item.completed" and e["item"].get("type") == "mcp_tool_call"
        ]
        offered = [
            t.get("name")
            for r in requests
            for t in r["body"].get("tools", [])
            if t.get("type") == "namespace"
        ]
        assert [(c["server"], c["tool"], c["status"]) for c in calls] == [
            ("fake", "count_items", "completed")
        ], (offered, run.stdout, run.stderr[-3000:])
        assert (
            messages
            and messages[-1].startswith("tool said:")
            and '{"limit": 3, "type": "int"}' in messages[-1]
        )
    else:
        assert messages == ["reply"]
    assert events[-1]["type"] == "turn.completed"
