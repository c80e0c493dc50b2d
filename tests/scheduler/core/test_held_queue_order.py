"""The held queues against a brute-force model: the head of every queue is the first turn in order.

Hypothesis drives adds, removals, re-files and changes of callers' in-flight counts on
:class:`~luftpause.scheduler.core.held.HeldTurns`, and after each step compares ``head(queue)``
with the minimum of ``(class rank, caller's in-flight turns, arrival)`` over a plain list.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.scheduler.core.held import HeldTurn, HeldTurns, QueueKey
from luftpause.scheduler.core.policies.ordering import order_key

QUEUES: list[QueueKey] = [("model", "m"), ("replica", "a")]
CALLERS = ["", "x", "y"]

step = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(QUEUES), st.sampled_from(CALLERS), st.booleans()),
    st.tuples(st.just("remove"), st.integers(0, 10_000)),
    st.tuples(st.just("refile"), st.integers(0, 10_000), st.sampled_from(QUEUES)),
    st.tuples(st.just("load"), st.sampled_from(CALLERS), st.integers(-2, 3)),
    st.tuples(st.just("place_head"), st.sampled_from(QUEUES)),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(step, max_size=200))
def test_head_is_the_first_turn_in_order(steps: list[tuple[object, ...]]) -> None:
    loads: dict[str, int] = {}
    held = HeldTurns()
    held.bind_loads(loads)
    live: dict[str, HeldTurn] = {}
    seq = 0
    for item in steps:
        kind = item[0]
        if kind == "add":
            _, queue, caller, batch = item
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
            loads[caller] = max(0, loads.get(caller, 0) + int(delta))  # type: ignore[call-overload]
            held.load_changed(caller)  # type: ignore[arg-type]
        elif kind == "place_head":
            turn = held.head(item[1])  # type: ignore[arg-type]
            if turn is not None:  # placing it raises its caller's count, as decide does
                held.remove(turn.turn_id)
                del live[turn.turn_id]
                loads[turn.caller] = loads.get(turn.caller, 0) + 1
                held.load_changed(turn.caller)
        assert len(held) == len(live)
        for queue in QUEUES:
            in_queue = [t for t in live.values() if t.queue == queue]
            expected = min(in_queue, key=lambda t: order_key(t, loads), default=None)
            assert held.head(queue) is expected


def test_a_caller_whose_load_falls_comes_first_at_once() -> None:
    loads = {"x": 5, "y": 3}
    held = HeldTurns()
    held.bind_loads(loads)
    queue: QueueKey = ("model", "m")
    x = HeldTurn("t0", "r0", "m", "batch", "x", "dp", 0.0, 0, queue)
    y = HeldTurn("t1", "r1", "m", "batch", "y", "dp", 1.0, 1, queue)
    held.add(x)
    held.add(y)
    assert held.head(queue) is y
    loads["x"] = 1
    held.load_changed("x")
    assert held.head(queue) is x
    loads["x"] = 4
    held.load_changed("x")
    assert held.head(queue) is y
