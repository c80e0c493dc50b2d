"""Claude Code and Codex CLI run for real against the capture server (``harness_capture``).

:func:`record` runs one of :data:`SESSIONS` (a text answer, a tool call the harness runs on the
stdio fake MCP server and answers, a sub-agent spawned) against a fresh
:class:`~harness_capture.CaptureServer` and returns the harness's result and every request it
sent. From the command line, ``python tests/harness_runs.py SESSION --out FILE [--translate]``:
the samples under ``tests/data/harnesses/`` were recorded so (``docs/harnesses.md``, "What the
harnesses send"). The harnesses come from npm (:data:`HARNESSES_ENV`); where they are absent,
:func:`harness_bin` answers ``None`` and the tests that need them skip.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from harness_capture import MODEL, CaptureServer

HARNESSES_ENV = "LUFTPAUSE_HARNESSES_DIR"
"""Where ``npm install @anthropic-ai/claude-code @openai/codex`` put the harnesses (its
``node_modules/.bin`` is searched); default ``~/.cache/luftpause/harnesses``."""

FAKE_MCP = [sys.executable, "-m", "luftpause.testkit.fakes.fake_mcp_stdio"]
"""The stdio MCP server whose ``count_items`` tool the tool sessions call (marked read-only, so
Codex calls it without approval)."""


def harness_bin(name: str) -> str | None:
    """The path of the ``claude`` or ``codex`` executable, or ``None`` when not installed."""
    folder = os.environ.get(HARNESSES_ENV) or os.path.expanduser("~/.cache/luftpause/harnesses")
    path = os.path.join(folder, "node_modules", ".bin", name)
    return path if os.access(path, os.X_OK) else None


@dataclass
class HarnessRun:
    returncode: int
    stdout: str
    stderr: str


def run_claude_code(
    url: str, home: str, prompt: str, tools: str = "", mcp: bool = False, timeout: float = 180
) -> HarnessRun:
    """``claude -p`` against ``url`` (``ANTHROPIC_BASE_URL``) with ``HOME=home``, built-in tools
    limited to ``tools`` (``""``: none), the fake MCP server's tools allowed when ``mcp``; its JSON
    result on stdout. Sends ``x-luftpause-class`` and ``x-luftpause-caller`` by
    ``ANTHROPIC_CUSTOM_HEADERS``."""
    exe = harness_bin("claude")
    assert exe is not None, "Claude Code is not installed"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-capture",
        "ANTHROPIC_CUSTOM_HEADERS": "x-luftpause-class: interactive\nx-luftpause-caller: capture",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [exe, "-p", "--tools", tools, "--model", MODEL]
    if mcp:
        config = os.path.join(home, "mcp.json")
        with open(config, "w") as f:
            json.dump(
                {"mcpServers": {"fake": {"type": "stdio", "command": FAKE_MCP[0], "args": FAKE_MCP[1:]}}}, f
            )
        cmd += ["--mcp-config", config, "--strict-mcp-config", "--allowedTools", "mcp__fake__*"]
        # else claude -p may send its first turn before the server's tools are listed; and the
        # server's start (Python imports) can take seconds on a loaded machine: wait up to 60 s
        env["MCP_CONNECTION_NONBLOCKING"] = "false"
        env["MCP_TIMEOUT"] = "60000"
    # --allowedTools takes several values: the options after it end them
    cmd += ["--output-format", "json"]
    done = subprocess.run([*cmd, prompt], env=env, cwd=home, capture_output=True, text=True, timeout=timeout)
    return HarnessRun(done.returncode, done.stdout, done.stderr)


def run_codex(url: str, home: str, prompt: str, mcp: bool = False, timeout: float = 180) -> HarnessRun:
    """``codex exec`` against ``url`` through a custom provider (``wire_api = "responses"``,
    ``http_headers`` with the two luftpause headers), sandbox read-only, approvals never, the fake
    MCP server configured when ``mcp``; ``CODEX_HOME`` under ``home``."""
    exe = harness_bin("codex")
    assert exe is not None, "Codex CLI is not installed"
    codex_home = os.path.join(home, ".codex")
    work = os.path.join(home, "work")
    os.makedirs(codex_home, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    config = f"""model = "{MODEL}"
model_provider = "capture"
approval_policy = "never"
sandbox_mode = "read-only"
web_search = "disabled"

[model_providers.capture]
name = "capture"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "CAPTURE_API_KEY"
http_headers = {{ "x-luftpause-class" = "interactive", "x-luftpause-caller" = "capture" }}
"""
    if mcp:
        config += f"""
[mcp_servers.fake]
command = {json.dumps(FAKE_MCP[0])}
args = {json.dumps(FAKE_MCP[1:])}
required = true
startup_timeout_sec = 60
"""
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(config)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "CODEX_HOME": codex_home,
        "CAPTURE_API_KEY": "sk-capture",
        "TERM": "dumb",
        "RUST_LOG": os.environ.get("CAPTURE_RUST_LOG", "error"),
    }
    cmd = [exe, "exec", "--skip-git-repo-check", "--json", prompt]
    done = subprocess.run(
        cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return HarnessRun(done.returncode, done.stdout, done.stderr)


SESSIONS: dict[str, dict[str, Any]] = {
    "claude-text": {"harness": "claude", "prompt": "Say hello"},
    "claude-tool": {
        "harness": "claude",
        "prompt": "Count items with limit 3",
        "mcp": True,
        "tool": "mcp__fake__count_items",
        "tool_input": {"limit": 3},
    },
    "claude-agent": {
        "harness": "claude",
        "prompt": "Say hi through a sub-agent",
        "tools": "Agent",
        "tool": "Agent",
        "tool_input": {"description": "say hi", "prompt": "Say hi", "subagent_type": "general-purpose"},
    },
    "codex-text": {"harness": "codex", "prompt": "Say hello"},
    "codex-tool": {
        "harness": "codex",
        "prompt": "Count items with limit 3 using the count_items tool",
        "mcp": True,
        "tool": "mcp__fake/count_items",
        "tool_input": {"limit": 3},
    },
    "codex-agent": {
        "harness": "codex",
        "prompt": "Say hi through a sub-agent",
        "tool": "multi_agent_v1/spawn_agent",
        "tool_input": {"message": "Say hi"},
    },
}
"""The recorded sessions: a text answer, a tool call answered by the harness, a sub-agent spawned.
``tool`` is the capture server's script (a namespace member written ``<namespace>/<name>``)."""


def record(
    session: str, translate: bool = False, fault: str | None = None, faults: int = 1
) -> tuple[HarnessRun, list[dict[str, Any]]]:
    """Run one of :data:`SESSIONS` against a fresh capture server; its result and the requests.
    ``fault`` (with ``translate``): see :meth:`CaptureServer._faulty`, for the first ``faults`` turns."""
    spec = SESSIONS[session]
    server = CaptureServer(spec.get("tool"), spec.get("tool_input"), translate, fault, faults).start()
    try:
        with tempfile.TemporaryDirectory(
            prefix="harness-", dir=os.path.expanduser("~/.cache/luftpause")
        ) as home:
            if spec["harness"] == "claude":
                run = run_claude_code(
                    server.url, home, spec["prompt"], spec.get("tools", ""), spec.get("mcp", False)
                )
            else:
                run = run_codex(server.url, home, spec["prompt"], spec.get("mcp", False))
    finally:
        server.stop()
    return run, server.recorded()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("session", choices=sorted(SESSIONS), help="which session to record")
    parser.add_argument("--out", required=True, help="JSON file the recorded requests are written to")
    parser.add_argument("--translate", action="store_true", help="answer through luftpause's translators")
    parser.add_argument("--keep", type=int, default=0, help="keep only the first N requests (0: all)")
    args = parser.parse_args()
    run, requests = record(args.session, args.translate)
    kept = requests[: args.keep] if args.keep else requests
    with open(args.out, "w") as f:
        json.dump(kept, f, indent=1)
        f.write("\n")
    print(f"exit {run.returncode}, {len(requests)} requests, {len(kept)} written to {args.out}")
    print(run.stdout[-2000:])
    print(run.stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
