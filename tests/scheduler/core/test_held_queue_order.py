"""The held queues against a brute-force model: the head of every queue is the first turn in order.

Hypothesis drives adds, removals, re-files and changes of callers' in-flight counts on
:class:`~luftpause.scheduler.core.held.HeldTurns`, with callers of a tree (``x/1`` and ``x/2`` under
``x``), and after each step compares ``head(queue)`` with the minimum of ``(class rank, root's
in-flight turns, caller's in-flight turns, rank, arrival)`` over a plain list, the root's count
summed over its callers as the model reckons it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.scheduler.core.held import HeldTurn, HeldTurns, QueueKey
from luftpause.scheduler.core.policies.ordering import order_key

QUEUES: list[QueueKey] = [("model", "m"), ("replica", "a")]
CALLERS = ["x/1", "x/2", "y", "x", "/z"]  # roots x, y and "" (the anonymous caller's)


def roots_of(loads: dict[str, int]) -> dict[str, int]:
    """Each root's in-flight turns: the sum over the callers under it (the model's own reckoning)."""
    roots: dict[str, int] = {}
    for caller, count in loads.items():
        top = caller.split("/")[0]
        roots[top] = roots.get(top, 0) + count
    return roots


step = st.one_of(
    st.tuples(
        st.just("add"), st.sampled_from(QUEUES), st.sampled_from(CALLERS), st.booleans(), st.integers(0, 3)
    ),
    st.tuples(st.just("remove"), st.integers(0, 10_000)),
    st.tuples(st.just("refile"), st.integers(0, 10_000), st.sampled_from(QUEUES)),
    st.tuples(st.just("load"), st.sampled_from(CALLERS), st.integers(-2, 3)),
    st.tuples(st.just("place_head"), st.sampled_from(QUEUES)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(step, min_size=25, max_size=200))
def test_head_is_the_first_turn_in_order(steps: list[tuple[object, ...]]) -> None:
    loads: dict[str, int] = {}
    roots: dict[str, int] = {}
    held = HeldTurns()
    held.bind_loads(loads, None, roots)

    def change(caller: str, count: int) -> None:
        fell = count < loads.get(caller, 0)
        loads[caller] = count
        roots.clear()
        roots.update(roots_of(loads))
        held.load_changed(caller, fell=fell)  # as decide says it: a rise pushes nothing

    live: dict[str, HeldTurn] = {}
    seq = 0
    for item in steps:
        kind = item[0]
        if kind == "add":
            _, queue, caller, batch, rank = item
            turn = HeldTurn(
                f"t{seq}",
                f"r{seq}",
                "m",
                "batch" if batch else "interactive",
                caller,
                "dp",
                float(seq),
                seq,
                queue,
                rank=float(rank),  # ties of rank between callers and turns: arrival decides
            )  # type: ignore[arg-type]
            seq += 1
            held.add(turn)
            live[turn.turn_id] = turn
        elif kind in ("remove", "refile") and live:
            turn_id = sorted(live)[int(item[1]) % len(live)]  # type: ignore[call-overload]
            if kind == "remove":
                assert held.remove(turn_id) is live.pop(turn_id)
            else:
                held.refile(live[turn_id], item[2])  # type: ignore[arg-type]
        elif kind == "load":
            _, caller, delta = item
            change(caller, max(0, loads.get(caller, 0) + int(delta)))  # type: ignore[call-overload, arg-type]
        elif kind == "place_head":
            turn = held.head(item[1])  # type: ignore[arg-type]
            if turn is not None:  # placing it raises its caller's count and its root's, as decide does
                held.remove(turn.turn_id)
                del live[turn.turn_id]
                change(turn.caller, loads.get(turn.caller, 0) + 1)
        assert len(held) == len(live)
        for queue in QUEUES:
            in_queue = [t for t in live.values() if t.queue == queue]
            expected = min(in_queue, key=lambda t: order_key(t, loads, roots), default=None)
            assert held.head(queue) is expected
    for name in {*CALLERS, "", "x/1/deep"}:  # a caller's count holds everything under it
        for cls in ("interactive", "batch"):
            under = [t for t in live.values() if t.service_class == cls and
                     (t.caller == name or t.caller.startswith(name + "/"))]  # fmt: skip
            assert held.count(name, cls) == len(under)


def test_a_caller_whose_load_falls_comes_first_at_once() -> None:
    loads = {"x": 5, "y": 3}
    roots = dict(loads)
    held = HeldTurns()
    held.bind_loads(loads, None, roots)
    queue: QueueKey = ("model", "m")
    x = HeldTurn("t0", "r0", "m", "batch", "x", "dp", 0.0, 0, queue)
    y = HeldTurn("t1", "r1", "m", "batch", "y", "dp", 1.0, 1, queue)
    held.add(x)
    held.add(y)
    assert held.head(queue) is y
    loads["x"] = roots["x"] = 1
    held.load_changed("x")
    assert held.head(queue) is x
    loads["x"] = roots["x"] = 4
    held.load_changed("x", fell=False)
    assert held.head(queue) is y


def test_a_sub_callers_load_falling_moves_its_siblings_turns_up() -> None:
    """``x/1`` holds nothing here, but its slots count for root ``x``: when they free, ``x/2``'s
    turn, whose own count never changed, comes before ``y``'s."""
    loads = {"x/1": 3, "y": 1}
    roots = {"x": 3, "y": 1}
    held = HeldTurns()
    held.bind_loads(loads, None, roots)
    queue: QueueKey = ("model", "m")
    sibling = HeldTurn("t0", "r0", "m", "batch", "x/2", "dp", 0.0, 0, queue)
    other = HeldTurn("t1", "r1", "m", "batch", "y", "dp", 1.0, 1, queue)
    held.add(sibling)
    held.add(other)
    assert held.head(queue) is other  # root x has 3 in flight, y 1
    loads.pop("x/1")
    roots.pop("x")
    held.load_changed("x/1")
    assert held.head(queue) is sibling
