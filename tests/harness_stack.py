"""Claude Code and Codex CLI run for real against a luftpause stack: their model turns through the
dataplane (``/v1/messages``, ``/v1/responses``), the runtime's tools over MCP, with a scripted
engine behind the dataplane that makes each harness orchestrate a sub-agent.

:class:`OrchestratingEngine` is a Chat Completions engine (the dataplane translates the harnesses'
turns to it) whose model, offered the runtime's ``spawn`` and ``await`` tools, calls ``spawn`` with
a task, then ``await`` with the handle ``spawn`` returned, then answers with what ``await`` said
the sub-agent answered; offered neither, it answers ``hello``. The sub-agent itself runs in the
runtime on the stack's simulated engines. Every request is recorded.

:func:`run_claude_code` and :func:`run_codex` are the configuration ``docs/harnesses.md`` gives,
written out: the token, the proxy with the luftpause headers, the runtime as an MCP server, the
built-in shell and edit tools off.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from harness_runs import HarnessRun, harness_bin

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.threaded_app import ThreadedApp

HARNESS_MODEL = "orchestrator"
SUB_AGENT_TASK = "Say hello"
_HANDLE = re.compile(r'\\?"handle\\?"\s*:\s*\\?"([^"\\]+)')
_ANSWER = re.compile(r'\\?"answer\\?"\s*:\s*\\?"((?:[^"\\]|\\.)*)')


def _tool_named(tools: list[dict[str, Any]], suffix: str) -> str | None:
    """The offered tool of the runtime named ``...spawn`` / ``...await`` (``mcp__luftpause__spawn``
    as both harnesses name it through the translation)."""
    for tool in tools:
        name = tool.get("function", {}).get("name", "")
        if "luftpause" in name and name.endswith(suffix):
            return str(name)
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def plan(body: dict[str, Any]) -> tuple[str, Any]:
    """The scripted model's next step for a Chat Completions request: ``("tool", (name,
    arguments))`` or ``("text", str)``."""
    tools = body.get("tools") or []
    spawn, wait = _tool_named(tools, "spawn"), _tool_named(tools, "await")
    called: dict[str, str] = {}  # tool call id -> tool name
    results: dict[str, str] = {}  # tool name -> what its latest call returned
    for message in body.get("messages", []):
        for call in message.get("tool_calls") or ():
            called[call.get("id", "")] = call.get("function", {}).get("name", "")
        if message.get("role") == "tool":
            results[called.get(message.get("tool_call_id", ""), "")] = _text(message.get("content"))
    if spawn is None or wait is None:
        return "text", "hello"
    if spawn not in results:
        return "tool", (spawn, {"task": SUB_AGENT_TASK, "model": DEFAULT_MODEL, "maxTokens": 16})
    if wait not in results:
        handle = _HANDLE.search(results[spawn])
        if handle is None:
            return "text", f"spawn returned no handle: {results[spawn][:300]}"
        return "tool", (wait, {"handles": [handle.group(1)], "timeout": 60})
    answer = _ANSWER.search(results[wait])
    said = answer.group(1) if answer else results[wait][:200]
    return "text", f"the sub-agent answered: {said}"


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class OrchestratingEngine(ThreadedApp):
    """See the module docstring. ``requests``: every chat request body, oldest first."""

    def __init__(self) -> None:
        super().__init__("orchestrating-engine")
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)

    def recorded(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        with self._lock:
            self.requests.append(body)
            self._ids += 1
            n = self._ids
        kind, what = plan(body)
        if kind == "tool":
            name, arguments = what
            call = {
                "id": f"call_orch{n:04d}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": what}
            finish = "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        base = {"id": f"chatcmpl-orch{n}", "created": 1, "model": body.get("model")}
        if not body.get("stream"):
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}
        delta: dict[str, Any] = {"role": "assistant"}
        if kind == "tool":
            delta["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
        else:
            delta["content"] = message["content"]
        out = _sse({**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        out += _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        out += _sse({**chunk, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"
        await response.write(out)
        await response.write_eof()
        return response


@dataclass(frozen=True)
class Endpoints:
    """Where the harness goes: the dataplane's base URL (no ``/v1``), the runtime's MCP URL, the
    token, and the caller its turns name."""

    dataplane: str
    mcp: str
    token: str
    caller: str


def run_claude_code(
    at: Endpoints, home: str, prompt: str, model: str = HARNESS_MODEL, mcp: bool = True, timeout: float = 300
) -> HarnessRun:
    """``claude -p`` with its turns on the dataplane (``ANTHROPIC_BASE_URL``, the token as
    ``ANTHROPIC_AUTH_TOKEN``, the luftpause headers in ``ANTHROPIC_CUSTOM_HEADERS``), the runtime as
    its only MCP server (``--mcp-config``, the token in its headers; ``mcp=False``: none), its
    built-in tools off (``--tools ""``) and the runtime's allowed (``--allowedTools
    "mcp__luftpause__*"``)."""
    exe = harness_bin("claude")
    assert exe is not None, "Claude Code is not installed"
    config = os.path.join(home, "mcp.json")
    with open(config, "w") as f:
        json.dump(
            {
                "mcpServers": {
                    "luftpause": {
                        "type": "http",
                        "url": at.mcp,
                        "headers": {"Authorization": f"Bearer {at.token}"},
                    }
                }
            },
            f,
        )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": at.dataplane,
        "ANTHROPIC_AUTH_TOKEN": at.token,
        "ANTHROPIC_CUSTOM_HEADERS": f"x-luftpause-class: interactive\nx-luftpause-caller: {at.caller}",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
        "MCP_CONNECTION_NONBLOCKING": "false",  # else the first turn may go out before the tools are listed
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [exe, "-p", "--tools", "", "--model", model, "--strict-mcp-config"]
    if mcp:
        # --allowedTools takes several values: the option after it ends them
        cmd += ["--mcp-config", config, "--allowedTools", "mcp__luftpause__*"]
    cmd += ["--output-format", "json", prompt]
    done = subprocess.run(cmd, env=env, cwd=home, capture_output=True, text=True, timeout=timeout)
    return HarnessRun(done.returncode, done.stdout, done.stderr)


CODEX_CONFIG = """model = "{model}"
model_provider = "luftpause"
approval_policy = "never"
sandbox_mode = "read-only"
web_search = "disabled"

[features]
shell_tool = false
unified_exec = false
view_image = false
multi_agent = false

[model_providers.luftpause]
name = "luftpause"
base_url = "{dataplane}/v1"
wire_api = "responses"
env_key = "LUFTPAUSE_TOKEN"
http_headers = {{ "x-luftpause-class" = "interactive", "x-luftpause-caller" = "{caller}" }}

[mcp_servers.luftpause]
url = "{mcp}"
bearer_token_env_var = "LUFTPAUSE_TOKEN"
required = true

[mcp_servers.luftpause.tools.spawn]
approval_mode = "approve"
"""
"""Codex's ``config.toml`` for luftpause (``docs/harnesses.md``). ``approval_mode = "approve"``:
Codex asks before an MCP tool not annotated read-only, and with ``approval_policy = "never"`` it
refuses it instead ("requires approval"). ``spawn`` is no read-only tool; ``await`` is annotated
``readOnlyHint`` by the runtime, so Codex calls it without one."""


def run_codex(
    at: Endpoints, home: str, prompt: str, model: str = HARNESS_MODEL, mcp: bool = True, timeout: float = 300
) -> HarnessRun:
    """``codex exec`` with :data:`CODEX_CONFIG` in ``CODEX_HOME`` (under ``home``; ``mcp=False``:
    without its ``[mcp_servers.luftpause]`` tables)."""
    exe = harness_bin("codex")
    assert exe is not None, "Codex CLI is not installed"
    codex_home, work = os.path.join(home, ".codex"), os.path.join(home, "work")
    os.makedirs(codex_home, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    config = CODEX_CONFIG.format(model=model, dataplane=at.dataplane, mcp=at.mcp, caller=at.caller)
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(config if mcp else config.split("\n[mcp_servers.luftpause]")[0])
    env = {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "CODEX_HOME": codex_home,
        "LUFTPAUSE_TOKEN": at.token,
        "TERM": "dumb",
        "RUST_LOG": "error",
    }
    cmd = [exe, "exec", "--skip-git-repo-check", "--json", prompt]
    done = subprocess.run(
        cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return HarnessRun(done.returncode, done.stdout, done.stderr)
