"""The run record: one sub-agent's arguments, conversation, counters and outcome, and the journal
records that describe it (shapes: :mod:`luftpause.runtime.runs.journal`).

A *run* is one sub-agent: its task, its conversation, its counters and, once finished, its answer
or error. Its state moves one way only::

    running ──▶ completed   the model answered without calling a tool
            ├─▶ failed      a turn failed (dataplane error, bad reply) or the loop broke
            └─▶ cancelled   ``cancel`` on it or an ancestor, or a budget of its subtree ran out

Pods (docs/architecture.md "Pods", :mod:`luftpause.runtime.pods.operations`): a finished run is not
closed for good. A ``message`` record (``send``) re-opens a completed or failed run (``running``
again, its answer kept in its conversation, the message a new user turn) or, while it runs, waits
in its ``inbox`` for its next turn; ``stop`` (a ``stop`` record) lets the current turn finish and then
ends it as ``cancelled`` with ``stopped by ...``. :attr:`Run.pod_state` is the three-state view
pods use: ``running``, ``idle`` (completed or failed, takes ``send``), ``stopped`` (cancelled or
stopped, takes nothing more).

A running run whose next tool calls wait for a person (:mod:`luftpause.runtime.agent.approvals`) is
reported as ``AwaitingApproval`` with ``pendingApprovals [{id, tool, arguments}]``; it is still
running.

Retention (:mod:`luftpause.runtime.runs.registry`, ``[runtime] retained_bytes``): a finished run may
have its conversation dropped to keep memory and the journal bounded by bytes. It then keeps its
state, answer, error, counters, the summary of its task (``task_chars`` its whole length) and the
newest of its *output entries* (the texts of its assistant messages, which ``read`` serves by
absolute index: ``outputs_base`` is the index of the first one kept), and takes no ``send``.

A run's fields are grouped by what they are for: :attr:`Run.spec` what it was asked (frozen; the
journal's ``start`` record, :class:`~luftpause.runtime.runs.spec.RunSpec`), :attr:`Run.costs` its
counters, :attr:`Run.approvals` the tool calls waiting for a person and the decisions taken,
:attr:`Run.durability` how its journal records fare, :attr:`Run.retention` what is kept once its
conversation is dropped; the conversation and the lifecycle (state, answer, error, ...) are the
record's own fields.

The record changes only through the registry (:mod:`luftpause.runtime.runs.registry`:
``finish``, ``complete_round``, ``check_budgets``), which journals each change; what
``await``/``status`` show of a run is :mod:`luftpause.runtime.runs.views`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from luftpause.runtime.runs.journal import encode
from luftpause.runtime.runs.spec import RunSpec, ServiceClass

if TYPE_CHECKING:
    import concurrent.futures

__all__ = [
    "BUDGET_KEYS",
    "CONVERSATION_DROPPED",
    "COUNTER_KEYS",
    "TASK_SUMMARY_CHARS",
    "ApprovalState",
    "Costs",
    "Counters",
    "Durability",
    "PendingRound",
    "Retention",
    "Run",
    "RunState",
    "ServiceClass",
    "add_counters",
    "new_handle",
    "summarize",
]

RunState = Literal["running", "completed", "failed", "cancelled"]

KEPT_OUTPUT_CHARS = 64 * 1024
"""Characters of output entries a run whose conversation was dropped keeps at most (the newest
entries; always at least the last one, its answer)."""

RECORD_OVERHEAD_BYTES = 512
"""Bytes counted for a retained run beyond its compacted record (the objects that hold it)."""

TASK_SUMMARY_CHARS = 200
"""Characters of a run's task shown where many runs are listed (``GET /status``, ``status`` without
a handle): enough to recognise it, while a listing stays small however long the tasks are."""


def summarize(text: str, limit: int = TASK_SUMMARY_CHARS) -> str:
    """``text`` itself when it has at most ``limit`` characters, else its first ``limit``
    characters followed by ``…`` (U+2026); the full length goes beside it (``taskChars``)."""
    return text if len(text) <= limit else f"{text[:limit]}…"


def new_handle() -> str:
    """A fresh run handle, ``run-`` and 16 hex digits (64 random bits)."""
    return f"run-{secrets.token_hex(8)}"


COUNTER_KEYS = (
    "turns",
    "toolCalls",
    "failedToolCalls",
    "promptTokens",
    "completionTokens",
    "turnSeconds",
    "toolSeconds",
)
"""The cost counters of a run (and of a subtree), as ``GET /status`` and the journal name them:
turns, tool calls, failed tool calls, prompt and completion tokens, and the seconds spent in turns
(waiting for the dataplane, queue included) and in tool rounds."""

Counters = dict[str, float]
"""Costs as JSON, keyed by :data:`COUNTER_KEYS` (a subtree's totals, a journal record's)."""

BUDGET_KEYS = ("tokens", "toolCalls", "seconds")
"""The budgets a run may set for its subtree, in the order they are checked."""


def add_counters(total: Counters, more: Counters) -> Counters:
    """``total`` with ``more`` added key by key (in place; returned for chaining)."""
    for key in COUNTER_KEYS:
        total[key] = total.get(key, 0) + more.get(key, 0)
    return total


@dataclass(slots=True)
class Costs:
    """A run's own counters: ``turns`` (LLM turns answered), ``tool_calls`` / ``failed_tool_calls``
    (calls the model made; failed = refused, raised, or an MCP ``isError`` result),
    ``prompt_tokens`` / ``completion_tokens`` summed over the turns' ``usage``, ``turn_seconds`` /
    ``tool_seconds`` spent in turns and tool rounds."""

    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    turn_seconds: float = 0.0
    tool_seconds: float = 0.0

    def to_json(self) -> Counters:
        """Keyed by :data:`COUNTER_KEYS`."""
        return {
            "turns": self.turns,
            "toolCalls": self.tool_calls,
            "failedToolCalls": self.failed_tool_calls,
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "turnSeconds": self.turn_seconds,
            "toolSeconds": self.tool_seconds,
        }

    def take(self, counters: Counters) -> None:
        """Take the counters of a journal record (missing keys stay as they are)."""
        self.turns = int(counters.get("turns", self.turns))
        self.tool_calls = int(counters.get("toolCalls", self.tool_calls))
        self.failed_tool_calls = int(counters.get("failedToolCalls", self.failed_tool_calls))
        self.prompt_tokens = int(counters.get("promptTokens", self.prompt_tokens))
        self.completion_tokens = int(counters.get("completionTokens", self.completion_tokens))
        self.turn_seconds = float(counters.get("turnSeconds", self.turn_seconds))
        self.tool_seconds = float(counters.get("toolSeconds", self.tool_seconds))


@dataclass(slots=True)
class ApprovalState:
    """The run's tool calls that wait for a person, and the decisions taken
    (:mod:`luftpause.runtime.agent.approvals`)."""

    decisions: dict[str, bool] = field(default_factory=dict)
    """Decisions not yet used, by call key (:func:`luftpause.runtime.agent.approvals.call_key`),
    journaled; an allowed call uses its decision up when it starts."""
    started: set[str] = field(default_factory=set)
    """Keys of approved calls that had started before a restart (asked again, never repeated
    silently)."""
    pending: list[Any] = field(default_factory=list)
    """The :class:`~luftpause.runtime.agent.approvals.PendingApproval` questions the run waits on."""

    def open(self) -> list[Any]:
        """The questions still unanswered (an answered one stays in :attr:`pending` until its call
        resumes, after its decision is journaled)."""
        return [a for a in self.pending if not a.decided.done()]


@dataclass(slots=True)
class PendingRound:
    """A tool round begun and not yet completed: the reply that asked for it, journaled (a
    ``turn`` record) before any of its calls runs, and the calls completed so far (a ``call``
    record each). A run rebuilt from the journal with a pending round runs only the calls that had
    not completed, under the same ids (:func:`luftpause.runtime.agent.upstream.call_id`), and is
    not asked for the reply again."""

    turn: int
    """The run's turn count when the reply came (:attr:`Costs.turns`, this turn included): with
    the handle and a call's index, the call's id."""
    message: dict[str, Any]
    """The assistant message: ``{"role": "assistant", "content", "tool_calls": [...]}``."""
    counters: Counters
    """The run's counters when the reply came, before any call of the round."""
    done: dict[int, tuple[dict[str, Any], bool]] = field(default_factory=dict)
    """Completed calls by index in the reply: ``(the role: tool message, failed)``."""

    @property
    def calls(self) -> list[Any]:
        """The reply's tool calls, as the engine gave them."""
        calls = self.message.get("tool_calls")
        return calls if isinstance(calls, list) else []

    @property
    def spent(self) -> int:
        """Tool calls the run had made before this round."""
        return int(self.counters.get("toolCalls", 0))

    def turn_record(self, handle: str) -> dict[str, Any]:
        """The ``turn`` record that begins it (shape: :mod:`luftpause.runtime.runs.journal`)."""
        return {
            "type": "turn",
            "handle": handle,
            "turn": self.turn,
            "message": self.message,
            "counters": self.counters,
        }

    def call_record(self, handle: str, index: int) -> dict[str, Any]:
        """The ``call`` record of its completed call ``index``."""
        message, failed = self.done[index]
        return {
            "type": "call",
            "handle": handle,
            "turn": self.turn,
            "index": index,
            "message": message,
            "failed": failed,
        }


@dataclass(slots=True)
class Durability:
    """How the run's journal records fare."""

    error: str | None = None
    """Set when a record of this run could not be written: the run is not durable (a restart
    resumes it from its last record written); its later records are not written."""
    damaged: str | None = None
    """Set by a replay that found a line of this run's journal damaged (not the torn last line of
    a crash, which held nothing acknowledged): what, and where. A run found so while unfinished is
    not resumed but failed with it (it might otherwise repeat or lose what the line held)."""
    start_lost: bool = False
    """Its ``start`` record was damaged or missing: what it was asked (task, model, ...) is lost
    beyond what the damaged line still shows, so it cannot take another turn (no ``send``)."""
    start_written: concurrent.futures.Future[None] | None = field(default=None, repr=False)
    """The journal write of its ``start`` record, if any."""
    last_written: concurrent.futures.Future[None] | None = field(default=None, repr=False)
    """The journal write of its latest record, if any."""


@dataclass(slots=True)
class Retention:
    """What a finished run keeps once its conversation was dropped for ``[runtime]
    retained_bytes`` (:func:`drop_conversation`), and the bytes the registry counts for it."""

    conversation_dropped: bool = False
    """``messages`` is empty, the spec's ``task`` its summary, ``system`` gone; it takes no ``send``."""
    kept_outputs: list[str] | None = None
    """The output entries it kept (the newest ones)."""
    outputs_base: int = 0
    """The absolute index (``read`` cursor) of the first of :attr:`kept_outputs`."""
    task_chars: int | None = None
    """The whole task's length in characters once the task was cut to its summary."""
    retained: int = 0
    """Bytes the registry counts for this run while it is finished (:func:`retained_size`)."""


@dataclass(eq=False)
class Run:
    """One sub-agent run: what it was asked (:attr:`spec`), its conversation, its lifecycle and
    the groups of the module docstring.

    ``messages`` is the OpenAI chat conversation so far (system?, user, then assistant and tool
    messages of each completed tool round). Times are ``time.time()`` seconds. ``children`` are
    handles; the spec's ``budget_*`` bound the subtree rooted here.
    """

    handle: str
    spec: RunSpec
    messages: list[dict[str, Any]]
    started_at: float = field(default_factory=time.time)
    children: list[str] = field(default_factory=list)
    state: RunState = "running"
    answer: str | None = None
    error: str | None = None
    exceeded: str | None = None
    """``budget exceeded: <which> <used>/<limit>`` once one of this run's own budgets ran out."""
    finished_at: float | None = None
    stopped_by: str | None = None
    """Who asked for a graceful stop (``stop``), once someone did: no new turn starts."""
    inbox: list[dict[str, Any]] = field(default_factory=list)
    """Messages sent while it ran, ``{"id", "content", "from"}``, for its next turn."""
    resumed: bool = False
    """Rebuilt from the journal after a restart (and, if running, resumed)."""
    interrupted: bool = False
    """Set when the runtime shuts down under a running run: it did not end, it was stopped."""
    costs: Costs = field(default_factory=Costs)
    pending_round: PendingRound | None = None
    """The tool round begun and not yet completed, if any (the registry's ``begin_round``)."""
    approvals: ApprovalState = field(default_factory=ApprovalState)
    durability: Durability = field(default_factory=Durability)
    retention: Retention = field(default_factory=Retention)

    @classmethod
    def new(cls, handle: str, spec: RunSpec, **lifecycle: Any) -> Run:
        """A run at its first turn: its conversation is the spec's system prompt (if any) and
        task. ``lifecycle`` sets other fields (``started_at``, ``resumed``)."""
        messages: list[dict[str, Any]] = []
        if spec.system:
            messages.append({"role": "system", "content": spec.system})
        messages.append({"role": "user", "content": spec.task})
        return cls(handle=handle, spec=spec, messages=messages, **lifecycle)

    # Who asked, in the words every part uses.

    @property
    def caller(self) -> str:
        return self.spec.caller

    @property
    def parent(self) -> str | None:
        return self.spec.parent

    @property
    def name(self) -> str | None:
        return self.spec.name

    @property
    def task(self) -> str:
        return self.spec.task

    # States.

    @property
    def done(self) -> bool:
        return self.state != "running"

    @property
    def pod_state(self) -> Literal["running", "idle", "stopped"]:
        """``running``; ``idle`` once completed or failed (``send`` continues it); ``stopped``
        once cancelled or stopped (it takes nothing more)."""
        if self.state == "running":
            return "running"
        return "stopped" if self.state == "cancelled" or self.stopped_by is not None else "idle"

    @property
    def stopping(self) -> bool:
        """Asked to stop (``stop``) while running: its current turn (and tool round) finishes,
        then it ends ``stopped``; until then :attr:`pod_state` stays ``running``."""
        return self.state == "running" and self.stopped_by is not None

    @property
    def message_refusal(self) -> str | None:
        """Why the run takes no message (``send``), for the sender to read; ``None`` when it takes
        one: not stopped, its conversation kept, its start record whole."""
        if self.pod_state == "stopped":
            return f"run {self.handle} is stopped; it takes no messages"
        if self.conversation_dropped:
            return CONVERSATION_DROPPED.format(handle=self.handle)
        if self.durability.start_lost:
            return START_LOST.format(handle=self.handle, damage=self.durability.damaged)
        return None

    @property
    def display_state(self) -> str:
        """:attr:`state`, or ``AwaitingApproval`` for a running run that waits for a person."""
        return "AwaitingApproval" if self.approvals.open() and not self.done else self.state

    @property
    def conversation_dropped(self) -> bool:
        return self.retention.conversation_dropped

    @property
    def task_length(self) -> int:
        """The whole task's length in characters (also once the task was cut to its summary)."""
        chars = self.retention.task_chars
        return chars if chars is not None else len(self.spec.task)

    @property
    def seconds(self) -> float:
        """Run time so far, or in total once finished (seconds)."""
        end = self.finished_at if self.finished_at is not None else time.time()
        return max(0.0, end - self.started_at)

    # Transitions (the registry calls these and journals them).

    def end(self, state: RunState, *, answer: str | None = None, error: str | None = None) -> bool:
        """Move to a final state once; ``False`` (and nothing changed) when it had ended already:
        the first outcome stands."""
        if self.done:
            return False
        if state == "running":
            raise ValueError("end() needs a final state")
        self.state = state
        self.answer = answer
        self.error = error
        self.finished_at = time.time()
        if not self.interrupted:  # a round cut short by an end is never resumed; by a shutdown, it is
            self.pending_round = None
        keep_answer(self)
        return True

    def reopen(self, message: dict[str, Any]) -> None:
        """A finished (completed or failed) run takes ``message`` (a ``user`` message) as a new
        turn: ``running`` again. The caller starts its loop. Raises ``ValueError`` for a run that
        is not idle or whose conversation was dropped."""
        if self.pod_state != "idle":
            raise ValueError(f"run {self.handle} is {self.pod_state}, not idle")
        if self.durability.start_lost:
            raise ValueError(START_LOST.format(handle=self.handle, damage=self.durability.damaged))
        if self.conversation_dropped:
            raise ValueError(CONVERSATION_DROPPED.format(handle=self.handle))
        self.state = "running"
        self.answer = self.error = None
        self.finished_at = None
        self.messages.append(message)

    def result(self) -> dict[str, Any]:
        """The run as ``await`` reports it (:func:`luftpause.runtime.runs.views.run_result`)."""
        from luftpause.runtime.runs.views import run_result

        return run_result(self)

    def status(self, *, full_task: bool = False) -> dict[str, Any]:
        """The run as ``status`` reports it (:func:`luftpause.runtime.runs.views.run_status`)."""
        from luftpause.runtime.runs.views import run_status

        return run_status(self, full_task=full_task)

    # The journal's records of this run (shapes: :mod:`luftpause.runtime.runs.journal`).

    def start_record(self) -> dict[str, Any]:
        """Every spawn argument as resolved (:meth:`RunSpec.start_record`), so that a restart can
        rebuild the run."""
        return self.spec.start_record(self.handle, self.started_at)

    def compacted_record(self) -> dict[str, Any]:
        """A finished run as compaction writes it: one ``run`` record with its start and outcome,
        and either its conversation (``messages``, beyond the system and task messages) or, once
        dropped, ``conversationDropped``, ``outputs`` (the kept entries), ``outputsBase`` and
        ``taskChars``; and, for a run a replay found damaged, ``damaged`` (what was found) and
        ``startLost``. Lists are copies: later changes to the run do not alter it."""
        record = {**self.start_record(), "type": "run", **self.outcome_record()}
        if self.conversation_dropped:
            record["conversationDropped"] = True
            record["outputs"] = list(self.retention.kept_outputs or ())
            record["outputsBase"] = self.retention.outputs_base
            record["taskChars"] = self.task_length
        else:
            record["messages"] = self.messages[2 if self.spec.system else 1 :]
        if self.durability.damaged is not None:  # what a replay found, kept past compaction
            record["damaged"] = self.durability.damaged
            if self.durability.start_lost:
                record["startLost"] = True
        return record

    def outcome_record(self) -> dict[str, Any]:
        """How the run ended (``state``, ``answer``?, ``error``?, ``exceeded``?, ``stoppedBy``?,
        ``finishedAt``, ``counters``); the ``end`` record, and with :meth:`start_record` a
        compacted ``run``."""
        out: dict[str, Any] = {
            "state": self.state,
            "finishedAt": self.finished_at,
            "counters": self.costs.to_json(),
        }
        pairs = (
            ("answer", self.answer),
            ("error", self.error),
            ("exceeded", self.exceeded),
            ("stoppedBy", self.stopped_by),
        )
        for key, value in pairs:
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_start_record(cls, record: dict[str, Any]) -> Run:
        """The run a ``start`` (or compacted ``run``) record describes, at its first turn.
        Raises ``KeyError`` / ``TypeError`` / ``ValueError`` for a record missing what a run needs."""
        return cls.new(
            str(record["handle"]), RunSpec.from_record(record), started_at=float(record["at"]), resumed=True
        )


START_LOST = (
    "run {handle} cannot take another turn: what it was asked is lost ({damage}); "
    "its answer and output so far are still there (status, read); spawn a new run to go on"
)

CONVERSATION_DROPPED = (
    "run {handle} is finished and its conversation was dropped to keep the runtime within "
    "[runtime] retained_bytes; it takes no more messages (its answer and output are still there: "
    "status, read; spawn a new run to go on)"
)


def output_entries(run: Run) -> tuple[int, list[str]]:
    """``(base, entries)``: the run's output entries ``read`` serves, the texts of its assistant
    messages in order (its answers included), and the absolute index of the first of them
    (``0`` while the conversation is held; more once older entries were dropped)."""
    if run.conversation_dropped:
        return run.retention.outputs_base, list(run.retention.kept_outputs or ())
    return 0, [
        m["content"]
        for m in run.messages
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]
    ]


def last_output(run: Run) -> str | None:
    """The run's newest output entry, found from the end (cheap for a long conversation)."""
    if run.conversation_dropped:
        kept = run.retention.kept_outputs
        return kept[-1] if kept else None
    for m in reversed(run.messages):
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]:
            return str(m["content"])
    return None


def retained_size(run: Run) -> int:
    """Bytes a finished run is counted for: its compacted journal record encoded (what
    compaction writes for it, so the compacted journal is about the sum of these) plus
    :data:`RECORD_OVERHEAD_BYTES`. Costs one encoding of the run (done once when it finishes
    and once when its conversation is dropped)."""
    return len(encode(run.compacted_record())) + RECORD_OVERHEAD_BYTES


def drop_conversation(run: Run) -> None:
    """Drop a finished run's conversation, system prompt and whole task; keep its outcome,
    counters, task summary and newest output entries (at most :data:`KEPT_OUTPUT_CHARS`
    characters, at least the last entry), numbered as before (``outputs_base``)."""
    if run.conversation_dropped:
        return
    base, entries = output_entries(run)
    kept: list[str] = []
    chars = 0
    for entry in reversed(entries):
        if kept and chars + len(entry) > KEPT_OUTPUT_CHARS:
            break
        kept.append(entry)
        chars += len(entry)
    kept.reverse()
    retention = run.retention
    retention.task_chars = run.task_length
    run.spec = run.spec.model_copy(update={"task": summarize(run.spec.task), "system": None})
    run.messages = []
    retention.kept_outputs = kept
    retention.outputs_base = base + len(entries) - len(kept)
    retention.conversation_dropped = True


def keep_answer(run: Run) -> None:
    """A completed run's answer is the last message of its conversation, so that a ``send``
    continues from it and ``read`` shows it (not appended twice on replay)."""
    if run.state != "completed" or run.answer is None or run.conversation_dropped:
        return
    last = run.messages[-1] if run.messages else {}
    said = last.get("role") == "assistant" and not last.get("tool_calls")
    if not (said and last.get("content") == run.answer):
        run.messages.append({"role": "assistant", "content": run.answer})


def apply_outcome(run: Run, record: dict[str, Any]) -> None:
    """Put a journaled outcome (``end`` or compacted ``run`` record) on a replayed run, without
    telling anyone (it is not news)."""
    state = record["state"]
    if state not in ("completed", "failed", "cancelled"):
        raise ValueError(f"not a final state: {state!r}")
    run.costs.take(record.get("counters") or {})
    run.state = state
    run.answer = record.get("answer")
    run.error = record.get("error")
    run.exceeded = record.get("exceeded")
    if record.get("stoppedBy") is not None:
        run.stopped_by = str(record["stoppedBy"])
    run.pending_round = None
    keep_answer(run)
    finished_at = record.get("finishedAt")
    run.finished_at = float(finished_at) if finished_at is not None else time.time()


def take_message(run: Run, content: str, sender: str, message_id: str) -> bool:
    """A ``message`` (``send``) for ``run``, journaled already: an idle run is re-opened with it as a
    new user turn (``True``: its loop must be started again), a running one keeps it in its inbox
    for its next turn (``False``)."""
    if run.done:
        run.reopen({"role": "user", "content": content})
        return True
    run.inbox.append({"id": message_id, "content": content, "from": sender})
    return False
