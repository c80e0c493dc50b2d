"""One KV pool in tokens, shared by running requests and the prefix cache.

The pool holds ``capacity`` tokens of KV. Some are *private* to running requests (prompt tokens
whose node is not complete yet, generated tokens, which have no key until the reply is cached);
the rest of the used tokens are *prefix nodes* of a tree, shared by every request whose prompt
starts with them. What is neither is free: ``free = capacity - private - cached``.

The tree follows SGLang's radix cache (``python/sglang/srt/mem_cache/radix_cache.py`` at
006b0e3d317f1cd4a7300e919a4eaa878b1947e7), with one node per message instead of per token run:

* a node is *pinned* while its ``lock_ref`` is above 0: ``inc_lock_ref`` / ``dec_lock_ref`` walk
  from a node to the root, so a running request pins its whole matched path, and pinned tokens
  are never evicted (SGLang moves them from ``evictable_size_`` to ``protected_size_``);
* ``evict(n)`` frees unpinned *leaves* least recently used first (a heap of
  ``evictable_leaves`` by last access time); a parent whose last child went becomes a leaf and
  a candidate in turn, so a prefix is never evicted before what extends it;
* a lookup (``match_prefix``) and an insert touch every node of the path.

vLLM's block pool (``vllm/v1/core/block_pool.py`` at 002f34915134cfd1a7d6ed777edd67dcc2289466)
comes to the same: cached blocks with ``ref_cnt`` 0 wait in the free queue as eviction
candidates, a freed request's blocks are queued tail first so its deepest blocks go first, and a
hit (``touch``) takes them out of the queue. Its 16-token blocks are not modelled: allocation and
hits are in tokens (at most 15 tokens per request apart).

Last access is a counter of operations, not a clock, so eviction order is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from luftpause.testkit.engine.model.requests import PrefixNode

__all__ = ["KVPool"]


@dataclass(slots=True)
class _Node:
    tokens: int
    parent: bytes | None
    children: int = 0
    lock_ref: int = 0
    last_access: int = 0


class KVPool:
    """The pool (``capacity`` tokens) and its prefix tree; see the module docstring.

    Counters: ``private`` (tokens held by requests outside the tree), ``cached`` (tokens of tree
    nodes), ``pinned`` (of those, with ``lock_ref`` > 0), ``evicted`` (tokens evicted since
    start). ``free`` and ``evictable`` are derived. Raises ``ValueError`` for a negative
    capacity and on misuse that would corrupt the counts (unlocking a node not locked,
    releasing more private tokens than held).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the KV pool must hold at least 1 token, got {capacity}")
        self.capacity = capacity
        self.private = 0
        self.cached = 0
        self.pinned = 0
        self.evicted = 0
        self._nodes: dict[bytes, _Node] = {}
        self._clock = itertools.count(1)
        # (last_access, key) of unpinned leaves; stale entries are skipped when popped.
        self._leaves: list[tuple[int, bytes]] = []

    # --- what is where ------------------------------------------------------------------------

    @property
    def free(self) -> int:
        return self.capacity - self.private - self.cached

    @property
    def evictable(self) -> int:
        return self.cached - self.pinned

    @property
    def used(self) -> int:
        """Tokens running requests hold: private ones and pinned prefix nodes."""
        return self.private + self.pinned

    def __contains__(self, key: bytes) -> bool:
        return key in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def lock_ref(self, key: bytes) -> int:
        """The node's ``lock_ref`` (0 for a node not in the tree)."""
        node = self._nodes.get(key)
        return 0 if node is None else node.lock_ref

    # --- the prefix tree ----------------------------------------------------------------------

    def match(self, nodes: Sequence[PrefixNode], touch: bool = True) -> int:
        """How many leading ``nodes`` the tree holds; touches them (deepest first) unless not
        ``touch``."""
        found = 0
        for key, _ in nodes:
            if key not in self._nodes:
                break
            found += 1
        if touch:
            self._touch([key for key, _ in nodes[:found]])
        return found

    def lock(self, keys: Sequence[bytes]) -> None:
        """Pin each of ``keys`` (tree nodes, root first) once more."""
        for key in keys:
            node = self._nodes[key]
            if node.lock_ref == 0:
                self.pinned += node.tokens
            node.lock_ref += 1

    def unlock(self, keys: Sequence[bytes]) -> None:
        """Undo one :meth:`lock` of each of ``keys``; an unpinned leaf becomes evictable."""
        for key in keys:
            node = self._nodes.get(key)
            if node is None or node.lock_ref < 1:
                raise ValueError("unlocking a prefix node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.pinned -= node.tokens
                self._maybe_leaf(key, node)

    def insert(self, parent: bytes | None, node: PrefixNode, from_private: bool) -> bool:
        """Add ``node`` under ``parent`` (``None``: the root), touched; returns whether it is new.

        With ``from_private`` its tokens are a request's private tokens turned into the node (a
        duplicate, already in the tree, frees them instead, as SGLang frees the KV it computed
        twice); without, they come from free tokens, which must be there (see :meth:`reserve`).
        Raises ``KeyError`` when ``parent`` is not in the tree.
        """
        key, tokens = node
        if parent is not None and parent not in self._nodes:
            raise KeyError("the parent prefix node is not in the tree")
        if from_private:
            self.release(tokens)
        existing = self._nodes.get(key)
        if existing is not None:
            self._touch([key])
            return False
        if not from_private and tokens > self.free:
            raise ValueError(f"no free room for a prefix node of {tokens} tokens")
        self._nodes[key] = _Node(tokens, parent, last_access=next(self._clock))
        self.cached += tokens
        if parent is not None:
            self._nodes[parent].children += 1
        self._maybe_leaf(key, self._nodes[key])
        return True

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` by evicting unpinned leaves, least recently used first (fewer
        if the evictable nodes hold fewer). Returns the tokens evicted."""
        done = 0
        while done < tokens and self._leaves:
            last_access, key = heapq.heappop(self._leaves)
            node = self._nodes.get(key)
            if node is None or node.lock_ref or node.children or node.last_access != last_access:
                continue  # stale: gone, pinned, no longer a leaf, or touched since
            del self._nodes[key]
            self.cached -= node.tokens
            self.evicted += node.tokens
            done += node.tokens
            if node.parent is not None:
                parent = self._nodes[node.parent]
                parent.children -= 1
                self._maybe_leaf(node.parent, parent)
        return done

    # --- room for requests --------------------------------------------------------------------

    def can_reserve(self, tokens: int) -> bool:
        """Whether ``tokens`` fit in free plus evictable tokens."""
        return tokens <= self.free + self.evictable

    def reserve(self, tokens: int) -> bool:
        """Make ``tokens`` free, evicting as needed; ``False`` (nothing evicted) when even
        evicting every unpinned node would not make room."""
        if not self.can_reserve(tokens):
            return False
        if tokens > self.free:
            self.evict(tokens - self.free)
        return True

    def allocate(self, tokens: int) -> bool:
        """Take ``tokens`` as private tokens of a request (:meth:`reserve` first); ``False``
        (nothing changed) when they do not fit."""
        if not self.reserve(tokens):
            return False
        self.private += tokens
        return True

    def release(self, tokens: int) -> None:
        """Give back ``tokens`` private tokens."""
        if tokens > self.private or tokens < 0:
            raise ValueError(f"releasing {tokens} private tokens of {self.private} held")
        self.private -= tokens

    # --- inner workings -----------------------------------------------------------------------

    def _touch(self, keys: Sequence[bytes]) -> None:
        # Deepest first, root last: an ancestor is never less recently used than its descendants.
        for key in reversed(keys):
            node = self._nodes[key]
            node.last_access = next(self._clock)
            self._maybe_leaf(key, node)

    def _maybe_leaf(self, key: bytes, node: _Node) -> None:
        if node.lock_ref == 0 and node.children == 0:
            heapq.heappush(self._leaves, (node.last_access, key))
            if len(self._leaves) > 64 and len(self._leaves) > 4 * len(self._nodes):
                self._compact()

    def _compact(self) -> None:
        # Touches leave stale heap entries behind; rebuild from the live leaves now and then.
        self._leaves = [
            (node.last_access, key)
            for key, node in self._nodes.items()
            if node.lock_ref == 0 and node.children == 0
        ]
        heapq.heapify(self._leaves)
