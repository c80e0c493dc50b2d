"""``POST /tokenize``: the simulator's prompt count, in vLLM's shape.

vLLM serves ``POST /tokenize`` with a chat request (``{"model", "messages", "tools",
"add_generation_prompt", "chat_template_kwargs"}``) or a completion one (``{"model", "prompt"}``)
and answers ``{"count": N, "max_model_len": M, "tokens": [ids...]}``. The simulator counts as its
chat completions do (:func:`~luftpause.testkit.engine.costs.estimate_prompt_tokens` of the
messages; a ``prompt`` as one user message), so a count here is the ``prompt_tokens`` the same
request's completion reports. The token ids are stand-ins (0, 1, 2, ...). 400 for a malformed
body, 404 for a model the engine does not serve (vLLM's error shape).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from luftpause.testkit.engine.costs import estimate_prompt_tokens
from luftpause.testkit.engine.settings import MAX_MODEL_LEN
from luftpause.testkit.engine.wire import RequestError, parse_json_body

__all__ = ["MAX_MODEL_LEN", "tokenize"]


def count_of(raw: bytes, served: Sequence[str]) -> int:
    """The prompt tokens of a ``/tokenize`` body; :class:`RequestError` (400, 404)."""
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and model not in served:
        raise RequestError(404, f"The model `{model}` does not exist.", "model")
    messages = body.get("messages")
    prompt = body.get("prompt")
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return estimate_prompt_tokens(messages)
    if isinstance(prompt, str):
        return estimate_prompt_tokens([{"role": "user", "content": prompt}])
    raise RequestError(400, "'messages' (a list of objects) or 'prompt' (a string) is required", "messages")


async def tokenize(served: Sequence[str], request: web.Request) -> web.Response:
    """The route's handler (``functools.partial(tokenize, models)``)."""
    try:
        count = count_of(await request.read(), served)
    except RequestError as exc:
        return web.json_response(exc.body(), status=exc.status)
    return web.json_response({"count": count, "max_model_len": MAX_MODEL_LEN, "tokens": list(range(count))})
