"""A replica's prefix cache: the KV of message prefixes it computed, bounded in tokens, LRU.

Real engines cache KV blocks keyed by token content (vLLM's hashed blocks, SGLang's radix tree).
Here the unit is a *message*: a prompt is a path of messages, and the node for message ``i`` is
keyed by a hash chained over the model name and messages ``0..i`` (role, texts, tool calls and
their ids, ``tool_call_id``), holding that message's tokens (see :func:`.costs.message_tokens`).
A request's cached tokens are those of its longest prefix of messages found, so:

* a run's next turn (its earlier messages, the assistant reply the engine cached when it finished,
  then new tool results) finds everything but the new messages;
* a run that moves to another replica finds nothing there and pays its whole prefill;
* distinct prompts fill the cache and evict the least recently used nodes, so a flood of batch
  prompts evicts an idle run's prefix.

As in a radix tree, a node is never evicted before its descendants: every lookup or insert touches
a path deepest node first and root last, so an ancestor is always more recently used than any node
below it and the least recently used node is a leaf. Like vLLM, a hit never covers the whole
prompt: at least one token is computed.

Not modelled: matches inside a message (a partial match counts as a miss for that message), and
pinning of the nodes that running requests use (they may be evicted while running).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.costs import message_texts, message_tokens


@dataclass(frozen=True, slots=True)
class PrefixPath:
    """A prompt's nodes, root first: ``(key, tokens of that message)`` per message."""

    nodes: tuple[tuple[bytes, int], ...]

    @property
    def tokens(self) -> int:
        return sum(tokens for _, tokens in self.nodes)

    def extended(self, message: Mapping[str, Any]) -> PrefixPath:
        """This path with ``message`` appended (the assistant reply that follows a prompt)."""
        parent = self.nodes[-1][0] if self.nodes else b""
        return PrefixPath((*self.nodes, (_chain(parent, message), message_tokens(message))))


def prefix_path(model: str, messages: Sequence[Mapping[str, Any]]) -> PrefixPath:
    """The path of ``messages`` for ``model`` (every model has its own tree)."""
    key = hashlib.blake2b(model.encode(), digest_size=16).digest()
    nodes: list[tuple[bytes, int]] = []
    for message in messages:
        key = _chain(key, message)
        nodes.append((key, message_tokens(message)))
    return PrefixPath(tuple(nodes))


def _chain(parent: bytes, message: Mapping[str, Any]) -> bytes:
    calls = [
        (
            call.get("id"),
            (call.get("function") or {}).get("name"),
            (call.get("function") or {}).get("arguments"),
        )
        for call in message.get("tool_calls") or ()
        if isinstance(call, Mapping)
    ]
    canonical = json.dumps(
        [message.get("role"), list(message_texts((message,))), calls, message.get("tool_call_id")],
        separators=(",", ":"),
    )
    return hashlib.blake2b(parent + canonical.encode(), digest_size=16).digest()


class PrefixCache:
    """Message-prefix nodes up to ``capacity`` tokens in all, least recently used evicted first.

    Counters (tokens): ``queries`` (prompt tokens looked up), ``hits`` (of those, found cached),
    ``evicted`` (tokens evicted); ``used`` is the tokens held now.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must not be negative, got {capacity}")
        self.capacity = capacity
        self._nodes: OrderedDict[bytes, int] = OrderedDict()
        self.used = 0
        self.queries = 0
        self.hits = 0
        self.evicted = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._nodes

    def lookup(self, path: PrefixPath, prompt_tokens: int) -> int:
        """Cached tokens of a prompt of ``prompt_tokens`` tokens (at most ``prompt_tokens - 1``);
        touches the nodes found and counts the query."""
        found: list[bytes] = []
        cached = 0
        for key, tokens in path.nodes:
            if key not in self._nodes:
                break
            found.append(key)
            cached += tokens
        self._touch(found)
        cached = max(0, min(cached, prompt_tokens - 1))
        self.queries += prompt_tokens
        self.hits += cached
        return cached

    def insert(self, path: PrefixPath) -> None:
        """Hold every node of ``path``, then evict least recently used nodes beyond ``capacity``."""
        if self.capacity == 0:
            return
        for key, tokens in path.nodes:
            if key not in self._nodes:
                self._nodes[key] = tokens
                self.used += tokens
        self._touch([key for key, _ in path.nodes])
        while self.used > self.capacity and self._nodes:
            _, tokens = self._nodes.popitem(last=False)
            self.used -= tokens
            self.evicted += tokens

    def _touch(self, keys: list[bytes]) -> None:
        # Deepest first, root last: ancestors stay more recently used than their descendants.
        for key in reversed(keys):
            self._nodes.move_to_end(key)
