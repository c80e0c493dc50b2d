"""Shared helpers of the runtime's tests: a bare run record, a configuration with its own state
directory, one ASGI request, and a whole stack with a second tool server serving a destructive
tool."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message

from luftpause.config import DEFAULT_MODEL, Config
from luftpause.runtime.runs.registry import Run
from luftpause.testkit.procs import ChildProcess, free_port
from luftpause.testkit.stack import Stack


def make_run(handle: str, **overrides: Any) -> Run:
    """A :class:`Run` with test defaults (batch, 8 tool calls, 256 tokens); ``overrides`` win."""
    fields: dict[str, Any] = {
        "handle": handle,
        "task": "t",
        "model": DEFAULT_MODEL,
        "service_class": "batch",
        "caller": "tester",
        "max_tool_calls": 8,
        "max_tokens": 256,
        "allowed_tools": None,
        "messages": [{"role": "user", "content": "t"}],
    }
    return Run(**{**fields, **overrides})


def with_state_dir(config: Config, state_dir: Path) -> Config:
    """``config`` with ``[runtime] state_dir`` set to ``state_dir``, so a test's journal never
    lands in the working directory."""
    runtime = config.runtime.model_copy(update={"state_dir": str(state_dir)})
    return config.model_copy(update={"runtime": runtime})


async def asgi_request(
    app: ASGIApp, method: str, path: str
) -> tuple[int, dict[str, str], bytes, Exception | None]:
    """One HTTP request through ``app`` in-process: (status, headers, body, what the app raised)."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:7999")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 7999),
    }
    raised: Exception | None = None
    try:
        await app(scope, receive, send)
    except Exception as exc:  # Starlette re-raises after answering 500, for the server's log
        raised = exc
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body, raised


@contextmanager
def stack_with_destructive_tools(workdir: Path) -> Iterator[tuple[Stack, str]]:
    """The whole stack plus a second fake MCP server, ``danger``, that also serves ``delete_note``
    (``destructiveHint: true``): yields the stack and that server's MCP URL; stops both."""
    port = free_port()
    danger = ChildProcess(
        "danger-mcp",
        ["fake-mcp", "--port", str(port), "--destructive"],
        workdir / "danger.log",
        ready_port=("127.0.0.1", port),
    )
    extra = f"""
[[mcp_servers]]
name = "danger"
url = "http://127.0.0.1:{port}/mcp"
"""
    try:
        danger.start().wait_ready()
        stack = Stack.start(workdir, extra_config=extra, env={"LUFTPAUSE_TOKEN": ""})
        try:
            yield stack, f"http://127.0.0.1:{port}/mcp"
        finally:
            stack.stop()
    finally:
        danger.stop()
