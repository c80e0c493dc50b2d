"""``POST /v1/messages/count_tokens``: the prompt's tokens as the engine that would serve it counts
them (Anthropic API reference, "Count tokens in a Message": the body of a Messages request without
``max_tokens``; the answer ``{"input_tokens": N}``).

It is not a turn: nothing is generated, so it is neither admitted nor scheduled. The request goes
to a replica serving its model (:meth:`~luftpause.dataplane.intake.front_doors.FrontDoors.count_plan`):
one that serves Messages and no Chat Completions gets it unchanged at the same path; any other gets
the request translated to Chat Completions (``apis.messages_request``, as a turn would be) and sent to the
engine's ``POST /tokenize`` in vLLM's chat form (``{"model", "messages", "tools",
"add_generation_prompt": true, "chat_template_kwargs"}`` -> ``{"count": N, ...}``), which applies
the model's chat template as the turn will. So ``input_tokens`` here is the count that the turn's
``message_start`` carries.

Errors: an unknown model 404; an engine that cannot be reached, or that refuses the request (one
whose ``/tokenize`` takes no messages), 502 naming the replica and what it said.
"""

from __future__ import annotations

import orjson

from luftpause.dataplane.errors import EngineUnreachable
from luftpause.dataplane.intake.front_doors import CountPlan
from luftpause.dataplane.relay.upstream import EngineError, EnginePool

__all__ = ["ANSWER_LIMIT_BYTES", "count_tokens"]

ANSWER_LIMIT_BYTES = 64 << 20
"""The most of an engine's ``/tokenize`` answer read (it lists every token id of the prompt)."""


async def count_tokens(pool: EnginePool, plan: CountPlan) -> bytes:
    """The answer's body, ``{"input_tokens": N}``; raises :class:`EngineUnreachable` (502)."""
    where = f"replica {plan.replica!r} ({plan.path})"
    try:
        exchange = await pool.send(plan.path, b"", plan.body)
        try:
            body = await exchange.read_all(ANSWER_LIMIT_BYTES)
            status = exchange.status
        finally:
            exchange.release()
    except EngineError as exc:
        raise EngineUnreachable(f"{where} could not count the prompt's tokens: {exc}") from None
    if status != 200:
        raise EngineUnreachable(f"{where} could not count the prompt's tokens: {status} {body[:300]!r}")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    count = None
    if isinstance(doc, dict):
        count = doc.get("input_tokens") if plan.native else doc.get("count")
        if count is None and not plan.native and isinstance(doc.get("tokens"), list):
            count = len(doc["tokens"])
    if type(count) is not int or count < 0:
        raise EngineUnreachable(f"{where} answered no token count: {body[:300]!r}")
    return orjson.dumps({"input_tokens": count})
