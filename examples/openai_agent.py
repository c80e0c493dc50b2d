"""An own-loop agent with the ``openai`` package: chat turns and a tool round until an answer.

    python examples/openai_agent.py --service-class batch --caller me \
        [--base-url http://127.0.0.1:8080/v1]

The client's ``default_headers`` carry the three luftpause headers on every turn; the loop is the
plain Chat Completions tool loop (assistant ``tool_calls`` -> one ``tool`` message per call).
"""

from __future__ import annotations

import json
from typing import Any

from _common import api_key, lookup, luftpause_headers, parse_args, report
from openai import OpenAI

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a topic up in the notes.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "What to look up."}},
                "required": ["query"],
            },
        },
    }
]
MAX_TURNS = 8


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    client = OpenAI(base_url=args.base_url, api_key=api_key(), default_headers=luftpause_headers(args))
    messages: list[Any] = [{"role": "user", "content": args.task}]
    run_ids: list[str | None] = []
    answer = ""
    for _ in range(MAX_TURNS):
        raw = client.chat.completions.with_raw_response.create(
            model=args.model, messages=messages, tools=TOOLS, max_tokens=64
        )
        run_ids.append(raw.headers.get("x-luftpause-run-id"))
        message = raw.parse().choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            query = json.loads(call.function.arguments or "{}").get("query", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": lookup(query)})
    report(args, run_ids, answer)


if __name__ == "__main__":
    main()
