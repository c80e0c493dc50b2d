"""What finished runs keep is bounded by bytes (``[runtime] retained_bytes``), and ``read``
cursors stay stable across compaction and restart (issue 5/6 review).

In-process: a run registry with a real store (the file journal in a temporary state directory,
or PostgreSQL: the ``store`` fixture), runs finished by
hand (no engine), and :class:`~luftpause.runtime.pods.operations.Pods` for ``read`` and ``send``. The byte
counts checked are the registry's own (:attr:`RunRegistry.retained_total`), never the process's
RSS.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from runtime_helpers import make_run, open_store, pods_over, stored_bytes

from luftpause.config import DEFAULT_MODEL, parse_config
from luftpause.runtime.errors import ExpiredRun, PodRefused
from luftpause.runtime.pods.actors import Actor
from luftpause.runtime.runs.record import KEPT_OUTPUT_CHARS, Run
from luftpause.runtime.runs.registry import RunRegistry

CONFIG = f'[[replicas]]\nname = "r"\nurl = "http://127.0.0.1:1"\nmodels = ["{DEFAULT_MODEL}"]\n'
CALLER = Actor.of_caller("c")


def _run(handle: str, system: str | None = None, task: str = "t") -> Run:
    return make_run(handle, caller="c", system=system, task=task)


def _answer(registry: RunRegistry, run: Run, *texts: str) -> None:
    """``run`` says each of ``texts`` in turn: all but the last as a journaled round's assistant
    message (with a user follow-up), the last as its answer."""
    for text in texts[:-1]:
        registry.complete_round(
            run, [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
        )
    registry.finish(run, "completed", answer=texts[-1])


def test_finished_runs_with_big_prompts_stay_within_the_byte_budget_and_compaction_shrinks(
    tmp_path: Path, store: str
) -> None:
    # The review's input, scaled down: 100 finished runs with a big system prompt each (64 KiB
    # here, 1 MiB there) under a budget of 1 MiB: at the count cap alone they kept everything.
    budget = 1024 * 1024
    big = "s" * (64 * 1024)

    async def go() -> None:
        journal = open_store(store, tmp_path, compact_bytes=1 << 40)  # compacted by the test only
        pods = pods_over(parse_config(CONFIG), store=journal, retained_bytes=budget)
        async with pods.registry as registry:
            runs = [
                registry.add(_run(f"run-{i:03d}", system=big, task=f"task {i} " + "x" * 1000))
                for i in range(100)
            ]
            for i, run in enumerate(runs):
                _answer(registry, run, f"first {i}", f"answer {i}")
                assert registry.retained_total <= budget, (i, registry.retained_total)
            written = runs[-1].durability.last_written
            assert written is not None
            await asyncio.wrap_future(written)  # its end: the last record queued
            before = journal.size
            assert before > 100 * len(big)  # every prompt was journaled at its start

            # The newest runs keep their conversation; the oldest dropped theirs (and kept their
            # answer, counters and output entries) or were forgotten.
            newest = registry.get("run-099")
            assert newest.messages[0]["content"] == big and not newest.conversation_dropped
            held = registry.all()
            dropped = [r for r in held if r.conversation_dropped]
            assert dropped, "no conversation was dropped"
            for run in dropped:
                assert run.messages == [] and run.spec.system is None and run.answer is not None
                i = int(run.handle[-3:])
                assert run.status()["taskChars"] == len(f"task {i} ") + 1000
                assert run.result()["conversationDropped"] is True
                read = pods.read(CALLER, run.handle)
                assert read["entries"] == [f"first {i}", f"answer {i}"] and read["cursor"] == 2
            forgotten = [f"run-{i:03d}" for i in range(100) if f"run-{i:03d}" not in {r.handle for r in held}]
            for handle in forgotten:
                with pytest.raises(ExpiredRun, match="retained_bytes"):
                    registry.get(handle)

            # A send to a run whose conversation was dropped is refused, saying why.
            with pytest.raises(PodRefused, match="conversation was dropped"):
                pods.send(CALLER, dropped[0].handle, "more")

            # Compaction writes only what is retained: about the budget, not every prompt.
            journal.compact_later(registry.journal_snapshot())
        after = stored_bytes(store, tmp_path)  # closing the journal wrote what was queued
        assert after <= budget + 64 * 1024, (before, after)
        assert after < before / 4, (before, after)

        # After a restart the same runs are held, the dropped ones still dropped, same entries.
        pods = pods_over(parse_config(CONFIG), store=open_store(store, tmp_path), retained_bytes=budget)
        async with pods.registry as again:
            assert {r.handle for r in again.all()} == {r.handle for r in held}
            assert again.retained_total <= budget
            for run in dropped:
                replayed = again.get(run.handle)
                assert replayed.conversation_dropped and replayed.answer == run.answer
                i = int(run.handle[-3:])
                read = pods.read(CALLER, run.handle)
                assert read["entries"] == [f"first {i}", f"answer {i}"] and read["cursor"] == 2
            assert again.get("run-099").messages[0]["content"] == big

    asyncio.run(go())


def test_read_cursor_of_a_stopped_run_survives_compaction_and_restart(tmp_path: Path, store: str) -> None:
    # The review's input: answer twice, stop, compact, restart. Compaction kept messages only for
    # idle runs, so read went from ['first', 'second'] cursor 2 to ['second'] cursor 1.
    async def go() -> None:
        journal = open_store(store, tmp_path, compact_bytes=1)
        pods = pods_over(parse_config(CONFIG), store=journal)
        async with pods.registry as registry:
            run = registry.add(_run("run-stopped"))
            _answer(registry, run, "first", "second")
            pods.stop(CALLER, run.handle)
            before = pods.read(CALLER, run.handle)
            assert (before["entries"], before["cursor"], before["state"]) == (
                ["first", "second"],
                2,
                "stopped",
            )
            journal.compact_later(registry.journal_snapshot())
        pods = pods_over(parse_config(CONFIG), store=open_store(store, tmp_path))
        async with pods.registry:
            after = pods.read(CALLER, "run-stopped")
            assert (after["entries"], after["cursor"], after["state"]) == (["first", "second"], 2, "stopped")
            assert pods.read(CALLER, "run-stopped", since=1)["entries"] == ["second"]

    asyncio.run(go())


def test_dropped_output_entries_keep_their_indices_and_read_says_how_many_were_dropped(
    tmp_path: Path, store: str
) -> None:
    # A run with more output than a dropped run keeps: the oldest entries go, the rest keep their
    # index; read(since=0) says how many were dropped, never renumbers.
    entry = "e" * (KEPT_OUTPUT_CHARS // 4)
    texts = [f"{i}:{entry}" for i in range(10)]

    async def go() -> None:
        journal = open_store(store, tmp_path, compact_bytes=1 << 40)
        pods = pods_over(parse_config(CONFIG), store=journal, retained_bytes=1 << 30)
        async with pods.registry as registry:
            run = registry.add(_run("run-long"))
            _answer(registry, run, *texts)
            # A budget the long run fits in once it drops its conversation, and not before.
            assert run.retention.retained > 100 * 1024
            registry.retained_bytes = 100 * 1024
            registry.finish(registry.add(_run("run-other")), "completed", answer="x")
            assert run.conversation_dropped and 0 < run.retention.outputs_base < 10
            base = run.retention.outputs_base
            read = pods.read(CALLER, run.handle, since=0)
            assert read["dropped"] == base and read["cursor"] == 10
            assert read["entries"] == texts[base:]
            assert pods.read(CALLER, run.handle, since=9)["entries"] == texts[9:]
            assert "dropped" not in pods.read(CALLER, run.handle, since=base)
            journal.compact_later(registry.journal_snapshot())
        pods = pods_over(parse_config(CONFIG), store=open_store(store, tmp_path), retained_bytes=1 << 30)
        async with pods.registry:
            read = pods.read(CALLER, "run-long", since=0)
            assert (read["dropped"], read["cursor"], read["entries"]) == (base, 10, texts[base:])

    asyncio.run(go())
