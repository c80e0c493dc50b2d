"""The tools tell a client (and its model) which values are valid, where a model tends to make
them up (issue 22: on the simulated engine Codex's ``spawn`` named model ``'hello'``, opencode's
``approve`` and ``cancel`` named handles ``'say'`` and ``'sub-agent'``; docs/harnesses.md):

* ``spawn``'s and ``run``'s ``model`` is an enum of the models the generative replicas serve
  (with ``null``, the default), and a sub-agent's built-in ``spawn`` says the same; a name outside
  it is refused, listing the models served; left out, the run is on the default model;
* ``cancel`` and ``approve`` of a handle that names no run refuse it naming the caller's own
  handles that would do (its runs still running; those waiting for approval).

Real processes: the runtime, through the real ``mcp`` client, over the scripted engine of the pods
tests, with a second generative replica (another model) and a single-pass one (whose model no
sub-agent can run on).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from mcp import Client
from pods_helpers import call, script, start_pod, tool_text, until

from luftpause.config import DEFAULT_MODEL

pytestmark = pytest.mark.integration

SECOND = "second-model"
REPLICAS = tomli_w.dumps(
    {
        "replicas": [
            {"name": "second", "url": "{engine_url}", "models": [SECOND]},
            {"name": "classifier", "kind": "single_pass", "url": "{engine_url}", "models": ["a-classifier"]},
        ]
    }
)
"""A second generative replica and a single-pass one, both the scripted engine."""


async def _refusal(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments, read_timeout_seconds=60)
    assert result.is_error, (tool, result.structured_content)
    return tool_text(result)


def test_the_tools_name_the_models_served_and_the_callers_own_handles(tmp_path: Path, store: str) -> None:
    with start_pod(tmp_path, workspace=None, extra_toml=REPLICAS, store=store) as pod:

        async def go() -> None:
            async with Client(f"{pod.url}/mcp") as client:
                tools = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
                for name in ("spawn", "run"):
                    model = tools[name]["properties"]["model"]
                    assert model["anyOf"] == [
                        {"type": "string", "enum": [DEFAULT_MODEL, SECOND]},
                        {"type": "null"},
                    ], model
                    assert f"default: '{DEFAULT_MODEL}'" in model["description"], model
                    assert "model" not in tools[name].get("required", []), name

                refused = await _refusal(client, "spawn", task="t", model="hello")
                served = f"models served: '{DEFAULT_MODEL}', '{SECOND}'"
                assert f"no generative replica serves model 'hello'; {served}" in refused, refused

                # A run left on the default model and one on the other; the first holds its turn.
                held = (await call(client, "spawn", task=script({"hold": "held", "say": "a"})))["handle"]
                other = (await call(client, "spawn", task=script({"say": "b"}), model=SECOND))["handle"]
                (done,) = (await call(client, "await", handles=[other], timeout=60))["runs"]
                assert done["state"] == "completed", done
                assert (await call(client, "status", handle=other))["run"]["model"] == SECOND

                async def holding() -> bool:
                    return pod.engine.holding(held)

                await until(holding, "the held run's turn at the engine")
                assert (await call(client, "status", handle=held))["run"]["model"] == DEFAULT_MODEL

                # The handles a model made up, answered with the real ones.
                refused = await _refusal(client, "cancel", handle="sub-agent")
                assert refused.endswith(f"unknown run handle 'sub-agent'; your runs still running: {held}")
                refused = await _refusal(client, "approve", handle="say", allow=False)
                assert refused.endswith(
                    "unknown run handle 'say'; none of your runs is waiting for approval "
                    "(a handle is what spawn returned)"
                ), refused
                # Another caller's runs are not named to it.
                async with Client(f"{pod.url}/mcp") as stranger:
                    refused = await _refusal(stranger, "cancel", handle="sub-agent")
                    assert held not in refused and "none of your runs is still running" in refused

                pod.engine.release("held")
                (finished,) = (await call(client, "await", handles=[held], timeout=60))["runs"]
                assert finished["state"] == "completed", finished

            # A sub-agent's own spawn offers the same choice.
            async with Client(f"{pod.url}/mcp") as client:
                parent = await call(
                    client, "spawn", task=script({"hold": "kid", "say": "c"}), orchestrate=True
                )

                async def parent_holding() -> bool:
                    return pod.engine.holding(parent["handle"])

                await until(parent_holding, "the orchestrating run's turn at the engine")
                listed = await call(client, "tools", handle=parent["handle"])
                (builtin,) = [t for t in listed["servers"][-1]["tools"] if t["name"] == "spawn"]
                assert builtin["inputSchema"]["properties"]["model"] == tools["spawn"]["properties"]["model"]
                pod.engine.release("kid")
                await call(client, "await", handles=[parent["handle"]], timeout=60)

        asyncio.run(go())
