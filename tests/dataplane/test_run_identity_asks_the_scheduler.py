"""A turn whose tool-call ids its worker does not know asks the scheduler which run emitted them;
a tool-paused run's ids ride in the resync; each worker takes a distinct number for its
dataplane id (docs/architecture.md "Several workers and several dataplanes")."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path

import pytest

from luftpause.config import ConfigError, DataplaneConfig, load_config
from luftpause.dataplane.intake.run_identity import RunIdentity
from luftpause.dataplane.runs import InFlight, RunTable
from luftpause.dataplane.wiring import dataplane_id_base, worker_dataplane_id
from luftpause.serving.ports import hold_worker_slot
from luftpause.tool_calls import MAX_LOOKUP_IDS, ToolCallTable
from luftpause.v1 import scheduler_pb2 as pb


def _identity() -> RunIdentity:
    return RunIdentity(RunTable(), ToolCallTable(), {})


def _no_header(name: str) -> str | None:
    return None


def test_unknown_tool_call_ids_make_a_provisional_run_that_asks_for_them() -> None:
    identity = _identity()
    run_id, new_run, ask = identity.run_of(_no_header, pb.INTERACTIVE, "", 1.0, lambda: ["call_1", "call_2"])
    assert new_run and run_id.startswith("run-")
    assert ask == ("call_1", "call_2")
    assert run_id in identity.runs.runs  # recorded, though its turn may not take a lease


def test_known_ids_a_named_run_and_no_ids_ask_nothing() -> None:
    identity = _identity()
    identity.tool_calls.remember("agent", ["call_1"], 0.0)
    assert identity.run_of(_no_header, pb.INTERACTIVE, "", 1.0, lambda: ["call_1"]) == ("agent", False, ())
    named = identity.run_of(lambda name: "mine", pb.INTERACTIVE, "", 1.0, lambda: ["call_9"])
    assert named == ("mine", False, ())
    _, new_run, ask = identity.run_of(_no_header, pb.INTERACTIVE, "", 1.0, lambda: [])
    assert new_run and ask == ()


def test_ids_of_a_run_ended_here_are_not_asked_about() -> None:
    identity = _identity()
    identity.tool_calls.remember("agent", ["call_1"], 0.0)
    identity.ended_runs["agent"] = 0.5
    _, new_run, ask = identity.run_of(_no_header, pb.INTERACTIVE, "", 1.0, lambda: ["call_1"])
    assert new_run and ask == ()


def test_at_most_the_lookup_limit_of_ids_is_asked_about() -> None:
    ids = [f"call_{i}" for i in range(MAX_LOOKUP_IDS + 10)]
    _, _, ask = _identity().run_of(_no_header, pb.INTERACTIVE, "", 1.0, lambda: ids)
    assert ask == tuple(ids[:MAX_LOOKUP_IDS])


def test_a_tool_paused_runs_ids_ride_in_the_resync_until_its_next_turn() -> None:
    table = RunTable()
    table.placed(InFlight("t1", "agent", "a", "m", pb.INTERACTIVE, ""), 0.0)
    table.ended("t1", True, 1.0, ("call_1", "call_2"))
    (run,) = table.resync_request("dp").runs
    assert run.phase == pb.TOOL_PAUSED and list(run.tool_call_ids) == ["call_1", "call_2"]
    table.placed(InFlight("t2", "agent", "a", "m", pb.INTERACTIVE, ""), 2.0)
    table.ended("t2", False, 3.0)
    (run,) = table.resync_request("dp").runs
    assert run.phase == pb.IDLE and list(run.tool_call_ids) == []


def _unique_address() -> str:
    """An address no other test, session or machine user shares: the slot locks are files in the
    temp dir named after it (a test's ``tmp_path.name`` is the same in every pytest session)."""
    return f"127.0.0.1:{uuid.uuid4().hex}"


def _take_slot(address: str, workers: int, taken: multiprocessing.Queue[int | None]) -> None:
    """A worker's start: take a number, say which, and exit (its lock goes with it)."""
    taken.put(hold_worker_slot("dataplane-test", address, workers, wait_s=0.0))


def test_workers_take_distinct_numbers_and_a_dead_workers_number_is_taken_again() -> None:
    address = _unique_address()
    assert hold_worker_slot("dataplane-test", address, 2, wait_s=0.0) == 0  # held by this process
    context = multiprocessing.get_context("fork")
    taken: multiprocessing.Queue[int | None] = context.Queue()
    for _ in range(2):  # the second starts after the first is gone, and takes its number
        worker = context.Process(target=_take_slot, args=(address, 2, taken))
        worker.start()
        assert taken.get(timeout=30) == 1
        worker.join(30)


def test_a_worker_that_finds_every_number_taken_gets_none() -> None:
    address = _unique_address()
    assert hold_worker_slot("dataplane-test", address, 1, wait_s=0.0) == 0
    assert hold_worker_slot("dataplane-test", address, 1, wait_s=0.0) is None  # another open file


def test_one_worker_keeps_the_dataplane_id_of_a_dataplane() -> None:
    config = load_config(None)
    assert worker_dataplane_id(config) == dataplane_id_base(config)
    assert dataplane_id_base(config).endswith(config.dataplane.listen)


def test_workers_is_checked_when_the_configuration_loads(tmp_path: Path) -> None:
    assert DataplaneConfig().workers == 1
    replica = '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'
    path = tmp_path / "luftpause.toml"
    path.write_text(f"[dataplane]\nworkers = 0\n{replica}")
    with pytest.raises(ConfigError, match=r"dataplane\.workers"):
        load_config(path)
    path.write_text(f"[dataplane]\nworkers = 4\n{replica}")
    assert load_config(path).dataplane.workers == 4
