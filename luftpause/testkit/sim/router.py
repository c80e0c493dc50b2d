"""SGLang's router 0.3.2, ``--policy cache_aware``, as its source decides (no classes, no admission).

From ``sgl-router/src/policies/cache_aware.rs`` and ``tree.rs`` (sgl-project/sglang, the
``sglang-router`` 0.3.x line):

* It keeps one approximate radix tree of the *text it routed*, shared by the workers of a model,
  each node tagged with the workers (tenants) it was routed to and when; ``tenant_char_count`` is
  the characters each worker's share of the tree holds. It never asks a worker what it caches.
* A request is **imbalanced** when the workers' loads (the router's own count of requests in
  flight to each) differ by more than ``balance_abs_threshold`` (64) *and* the busiest has more than
  ``balance_rel_threshold`` (1.5) times the idlest: then it goes to the least loaded worker (its
  text is still inserted under that worker).
* Otherwise the longest prefix of its text found in the tree decides: if the match covers more than
  ``cache_threshold`` (0.3) of the text, the request goes to the worker holding that prefix
  (``prefix_match`` takes the first tenant of the deepest matched node; here the most recently
  used, so that the choice is deterministic); else to the worker with the **smallest tree**
  (``get_smallest_tenant``, fewest characters held), not the least loaded one.
* The request's text is then inserted under the chosen worker. Eviction (every 60 s, down to
  ``max_tree_size`` = 67,108,864 characters per worker) never triggers at these sizes.
* Every request goes straight to the chosen worker's engine: no queue, no class, no admission.

The tree here is over prompt *nodes* (one per message, :class:`PrefixPath`), not characters: a match
ends at a message boundary, and shares are counted in tokens (4 characters each, so the ratios are
the same). The characters two different messages share at their start (all system prompts begin
``run ``) are not counted: under 0.2 % of a flood prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from luftpause.testkit.engine.prefix_cache import PrefixPath

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


@dataclass(slots=True)
class _Node:
    tokens: int
    tenants: dict[int, int] = field(default_factory=dict)
    """Worker index -> the sequence number of its last access (larger is more recent)."""


class ApproximateTree:
    """The router's tree of routed prompts: node key -> the workers it was routed to."""

    def __init__(self, workers: int) -> None:
        self._nodes: dict[bytes, _Node] = {}
        self.size = [0] * workers
        """Tokens of the tree each worker holds (``tenant_char_count`` / 4)."""
        self._clock = 0

    def prefix_match(self, path: PrefixPath) -> tuple[int, int | None]:
        """Tokens of the longest prefix of ``path`` in the tree, and the worker holding it."""
        matched = 0
        deepest: _Node | None = None
        for key, tokens in path.nodes:
            node = self._nodes.get(key)
            if node is None or not node.tenants:
                break
            matched += tokens
            deepest = node
        if deepest is None:
            return 0, None
        tenant = max(deepest.tenants, key=lambda worker: deepest.tenants[worker])
        return matched, tenant

    def insert(self, path: PrefixPath, worker: int) -> None:
        """Tag every node of ``path`` with ``worker`` (now its most recent access)."""
        self._clock += 1
        for key, tokens in path.nodes:
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = _Node(tokens)
            if worker not in node.tenants:
                self.size[worker] += tokens
            node.tenants[worker] = self._clock

    def smallest(self) -> int:
        """The worker holding the fewest tokens of the tree (the first on a tie)."""
        return min(range(len(self.size)), key=lambda worker: (self.size[worker], worker))


class CacheAwareRouter:
    """The routing decision of ``cache_aware`` over ``workers`` engines; :meth:`route` picks one."""

    def __init__(
        self,
        workers: int,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
    ) -> None:
        self.tree = ApproximateTree(workers)
        self.load = [0] * workers
        """Requests in flight to each worker, as the router counts them."""
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold

    def route(self, path: PrefixPath) -> int:
        """The worker for a request with prompt ``path``; counts it in flight there."""
        load = self.load
        busiest, idlest = max(load), min(load)
        if busiest - idlest > self.balance_abs_threshold and busiest > idlest * self.balance_rel_threshold:
            worker = min(range(len(load)), key=lambda w: (load[w], w))
        else:
            total = path.tokens
            matched, holder = self.tree.prefix_match(path)
            if holder is not None and total and matched / total > self.cache_threshold:
                worker = holder
            else:
                worker = self.tree.smallest()
        self.tree.insert(path, worker)
        load[worker] += 1
        return worker

    def done(self, worker: int) -> None:
        """A request to ``worker`` ended (its response body closed)."""
        self.load[worker] -= 1
