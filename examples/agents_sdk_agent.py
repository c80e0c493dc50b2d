"""An agent on the OpenAI Agents SDK (``openai-agents``) whose turns go through luftpause.

    python examples/agents_sdk_agent.py --service-class batch --caller me \
        [--base-url http://127.0.0.1:8080/v1]

luftpause serves Chat Completions, not the Responses API, so the agent's model is
``OpenAIChatCompletionsModel`` over an ``AsyncOpenAI`` client whose ``base_url`` is the dataplane
and whose ``default_headers`` are the three luftpause headers. The SDK's trace export (to OpenAI)
is turned off: nothing here should leave for another host.
"""

from __future__ import annotations

import asyncio

import httpx
from _common import RunIdRecorder, api_key, lookup, luftpause_headers, parse_args, report
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def lookup_notes(query: str) -> str:
    """Look a topic up in the notes.

    Args:
        query: What to look up.
    """
    return lookup(query)


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    set_tracing_disabled(True)
    recorder = RunIdRecorder()
    async with httpx.AsyncClient(event_hooks={"response": [recorder.async_hook]}) as http:
        client = AsyncOpenAI(
            base_url=args.base_url,
            api_key=api_key(),
            default_headers=luftpause_headers(args),
            http_client=http,
        )
        agent = Agent(
            name="researcher",
            instructions="Use lookup_notes, then answer in one sentence.",
            tools=[lookup_notes],
            model=OpenAIChatCompletionsModel(model=args.model, openai_client=client),
            model_settings=ModelSettings(max_tokens=64),
        )
        result = await Runner.run(agent, args.task, max_turns=8)
    report(args, recorder.run_ids, str(result.final_output))


if __name__ == "__main__":
    asyncio.run(main())
