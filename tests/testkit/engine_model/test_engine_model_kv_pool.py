"""The engine model's KV pool: eviction order (least recently used, leaves first) and pinning (a
prefix that a running request uses is never evicted), on the pool alone and in an engine."""

from __future__ import annotations

import pytest
from engine_model_helpers import by_id, path, run_until_idle, small, then

from luftpause.testkit.engine.model import EngineModel, EngineRequest, KVPool, RequestFinished

# A tree of 10-token nodes: a -> b -> c, a -> d, e; built root first in this order, so the last
# access of a, b, c, d, e is 1, 2, 3, 4, 5.
TREE = [("a", None), ("b", "a"), ("c", "b"), ("d", "a"), ("e", None)]


def build(pool: KVPool) -> None:
    for name, parent in TREE:
        assert pool.allocate(10)
        pool.insert(None if parent is None else parent.encode(), (name.encode(), 10), from_private=True)


def eviction_order(pool: KVPool) -> list[str]:
    """Evict one node at a time; the names in the order they went."""
    gone: list[str] = []
    while True:
        before = {name for name, _ in TREE if name.encode() in pool}
        if not pool.evict(1):
            return gone
        gone.extend(sorted(before - {name for name, _ in TREE if name.encode() in pool}))


@pytest.mark.parametrize(
    ("touched", "locked", "order"),
    [
        # Least recently used first: c, then b (older than d) once c left it a leaf, and so on; a
        # parent is a candidate only once its children went.
        ([], [], ["c", "b", "d", "a", "e"]),
        # Touching a path makes all of it recent: a, b, c go last, deepest first.
        (["a", "b", "c"], [], ["d", "e", "c", "b", "a"]),
        (["a", "d"], [], ["c", "b", "e", "d", "a"]),
        # A pinned path is never evicted, nor are its ancestors (they are pinned with it).
        ([], ["a", "d"], ["c", "b", "e"]),
        ([], ["e"], ["c", "b", "d", "a"]),
    ],
)
def test_eviction_takes_unpinned_leaves_least_recently_used_first(
    touched: list[str], locked: list[str], order: list[str]
) -> None:
    pool = KVPool(100)
    build(pool)
    if touched:
        pool.match([(name.encode(), 10) for name in touched])
    pool.lock([name.encode() for name in locked])
    assert eviction_order(pool) == order
    assert pool.cached == 10 * len(locked) and pool.pinned == pool.cached


def test_counts_add_up_through_allocate_insert_lock_evict_release() -> None:
    pool = KVPool(100)
    assert pool.allocate(30)
    pool.insert(None, (b"a", 20), from_private=True)
    assert (pool.private, pool.cached, pool.free, pool.evictable) == (10, 20, 70, 20)
    pool.lock([b"a"])
    assert (pool.pinned, pool.evictable, pool.used) == (20, 0, 30)
    assert not pool.allocate(71)  # 70 free, nothing evictable
    assert pool.allocate(70)
    assert pool.free == 0
    pool.release(80)
    pool.unlock([b"a"])
    assert pool.allocate(100)  # evicts a
    assert (pool.cached, pool.evicted) == (0, 20)
    with pytest.raises(ValueError):
        pool.unlock([b"a"])


def test_a_duplicate_node_frees_the_private_copy() -> None:
    pool = KVPool(100)
    assert pool.allocate(20)
    assert pool.insert(None, (b"a", 20), from_private=True)
    assert pool.allocate(20)
    assert not pool.insert(None, (b"a", 20), from_private=True)
    assert (pool.private, pool.cached) == (0, 20)


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_a_prefix_in_use_is_never_evicted_while_others_are(style: str) -> None:
    # A long decode pins its 1,000-token prompt while 20 distinct 600-token prompts pass through a
    # 3,000-token pool and evict each other; a request sharing the pinned prompt still finds it.
    engine = EngineModel(small(style, 3000))
    prompt = path("pinned", 600, 400)
    engine.submit(EngineRequest("long", prompt, 1500), 0.0)
    moment = 0.0
    for index in range(20):
        moment += 0.5
        engine.advance(moment)
        engine.submit(EngineRequest(f"x{index}", path(f"x{index}", 600), 5), moment)
    engine.advance(moment + 0.5)
    engine.submit(EngineRequest("sharer", then(prompt, "question", 50), 5), moment + 0.5)
    events = run_until_idle(engine)
    finished = by_id(events, RequestFinished)
    assert finished["long"].completion_tokens == 1500
    assert finished["sharer"].cached_tokens == 1000
    assert finished["sharer"].time < finished["long"].time  # it ran while "long" pinned the prompt
    # Some of the others' prefixes were evicted: they did not all fit.
    assert engine.load().cached_tokens < 1000 + 20 * 600
