"""The run record: one sub-agent's arguments, conversation, counters and outcome, and the journal
records that describe it (shapes: :mod:`luftpause.runtime.runs.journal`).

A *run* is one sub-agent: its task, its conversation, its counters and, once finished, its answer
or error. Its state moves one way only::

    running ──▶ completed   the model answered without calling a tool
            ├─▶ failed      a turn failed (dataplane error, bad reply) or the loop broke
            └─▶ cancelled   ``cancel`` on it or an ancestor, or a budget of its subtree ran out

Pods (DESIGN.md "Pods", :mod:`luftpause.runtime.pods.operations`): a finished run is not closed for good. A
``message`` record (``send``) re-opens a completed or failed run (``running`` again, its answer
kept in its conversation, the message a new user turn) or, while it runs, waits in its
``inbox`` for its next turn; ``stop`` (a ``stop`` record) lets the current turn finish and then
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

The registry that owns runs is :mod:`luftpause.runtime.runs.registry`; what ``await``/``status`` show of a
run is :mod:`luftpause.runtime.runs.views`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from luftpause.runtime.runs.journal import encode

RunState = Literal["running", "completed", "failed", "cancelled"]
ServiceClass = Literal["interactive", "batch"]

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

BUDGET_KEYS = ("tokens", "toolCalls", "seconds")
"""The budgets a run may set for its subtree, in the order they are checked."""


def add_counters(total: Counters, more: Counters) -> Counters:
    """``total`` with ``more`` added key by key (in place; returned for chaining)."""
    for key in COUNTER_KEYS:
        total[key] = total.get(key, 0) + more.get(key, 0)
    return total


@dataclass(eq=False)
class Run:
    """One sub-agent run.

    ``messages`` is the OpenAI chat conversation so far (system?, user, then assistant and tool
    messages of each completed tool round). Counters: ``turns`` (LLM turns answered),
    ``tool_calls`` / ``failed_tool_calls`` (calls the model made; failed = refused, raised, or an
    MCP ``isError`` result), ``prompt_tokens`` / ``completion_tokens`` summed over the turns'
    ``usage``, ``turn_seconds`` / ``tool_seconds`` spent in turns and tool rounds. Times are
    ``time.time()`` seconds. ``parent`` and ``children`` are handles; ``budget_*`` bound the
    subtree rooted here (``None``: no bound).
    """

    handle: str
    task: str
    model: str
    service_class: ServiceClass
    caller: str
    max_tool_calls: int
    max_tokens: int
    allowed_tools: frozenset[str] | None
    messages: list[dict[str, Any]]
    system: str | None = None
    parallel_tool_calls: bool = False
    """The model may ask for several tool calls in one reply, run concurrently (loop.py)."""
    parent: str | None = None
    budget_tokens: int | None = None
    budget_tool_calls: int | None = None
    budget_seconds: float | None = None
    approve_tools: frozenset[str] = frozenset()
    """Tools that wait for a person's approval in this run, whatever their annotations."""
    decisions: dict[str, bool] = field(default_factory=dict)
    """Approval decisions not yet used, by call key (:func:`luftpause.runtime.agent.approvals.call_key`),
    journaled; an allowed call uses its decision up when it starts."""
    started_calls: set[str] = field(default_factory=set)
    """Keys of approved calls that had started before a restart (asked again, never repeated
    silently)."""
    pending_approvals: list[Any] = field(default_factory=list)
    """The :class:`~luftpause.runtime.agent.approvals.PendingApproval` questions the run waits on."""
    journal_error: str | None = None
    """Set when a journal record of this run could not be written: the run is not durable (a
    restart resumes it from its last record written); its later records are not written."""
    start_written: Any = field(default=None, repr=False)
    """The journal write of its ``start`` record (a ``concurrent.futures.Future``), if any."""
    last_written: Any = field(default=None, repr=False)
    """The journal write of its latest record (a ``concurrent.futures.Future``), if any."""
    children: list[str] = field(default_factory=list)
    state: RunState = "running"
    answer: str | None = None
    error: str | None = None
    exceeded: str | None = None
    """``budget exceeded: <which> <used>/<limit>`` once one of this run's own budgets ran out."""
    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    turn_seconds: float = 0.0
    tool_seconds: float = 0.0
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    resumed: bool = False
    """Rebuilt from the journal after a restart (and, if running, resumed)."""
    interrupted: bool = False
    """Set when the runtime shuts down under a running run: it did not end, it was stopped."""
    name: str | None = None
    """The name its spawner gave it (unique among the spawner's live children), if any."""
    orchestrate: bool = False
    """Offered the orchestration tools (spawn, send, read, stop, list) in its turns."""
    stopped_by: str | None = None
    """Who asked for a graceful stop (``stop``), once someone did: no new turn starts."""
    inbox: list[dict[str, Any]] = field(default_factory=list)
    """Messages sent while it ran, ``{"id", "content", "from"}``, for its next turn."""
    conversation_dropped: bool = False
    """Its conversation was dropped for the byte budget (:func:`drop_conversation`): ``messages``
    is empty, ``task`` its summary, ``system`` gone; it takes no ``send``."""
    kept_outputs: list[str] | None = None
    """Once its conversation is dropped: the output entries it kept (the newest ones)."""
    outputs_base: int = 0
    """The absolute index (``read`` cursor) of the first entry of ``kept_outputs``."""
    task_chars: int | None = None
    """The whole task's length in characters once ``task`` was cut to its summary."""
    retained: int = 0
    """Bytes the registry counts for this run while it is finished (:func:`retained_size`)."""
    _on_finish: Callable[[Run], None] | None = field(default=None, repr=False)
    _on_round: Callable[[Run, list[dict[str, Any]], dict[str, Any]], None] | None = field(
        default=None, repr=False
    )
    _on_budget_check: Callable[[Run, dict[str, float] | None], None] | None = field(default=None, repr=False)

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
    def display_state(self) -> str:
        """:attr:`state`, or ``AwaitingApproval`` for a running run that waits for a person."""
        return "AwaitingApproval" if self.open_approvals() and not self.done else self.state

    def open_approvals(self) -> list[Any]:
        """The questions still unanswered (an answered one stays in :attr:`pending_approvals`
        until its call resumes, after its decision is journaled)."""
        return [a for a in self.pending_approvals if not a.decided.done()]

    @property
    def task_length(self) -> int:
        """The whole task's length in characters (also once ``task`` was cut to its summary)."""
        return self.task_chars if self.task_chars is not None else len(self.task)

    @property
    def seconds(self) -> float:
        """Run time so far, or in total once finished (seconds)."""
        end = self.finished_at if self.finished_at is not None else time.time()
        return max(0.0, end - self.started_at)

    @property
    def limits(self) -> dict[str, float]:
        """The budgets this run sets for its subtree, by :data:`BUDGET_KEYS` name (only those set)."""
        values = {
            "tokens": self.budget_tokens,
            "toolCalls": self.budget_tool_calls,
            "seconds": self.budget_seconds,
        }
        return {k: v for k, v in values.items() if v is not None}

    def counters(self) -> Counters:
        """This run's own costs, keyed by :data:`COUNTER_KEYS`."""
        return {
            "turns": self.turns,
            "toolCalls": self.tool_calls,
            "failedToolCalls": self.failed_tool_calls,
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "turnSeconds": self.turn_seconds,
            "toolSeconds": self.tool_seconds,
        }

    def set_counters(self, counters: Counters) -> None:
        """Take the counters of a journal record (missing keys stay as they are)."""
        self.turns = int(counters.get("turns", self.turns))
        self.tool_calls = int(counters.get("toolCalls", self.tool_calls))
        self.failed_tool_calls = int(counters.get("failedToolCalls", self.failed_tool_calls))
        self.prompt_tokens = int(counters.get("promptTokens", self.prompt_tokens))
        self.completion_tokens = int(counters.get("completionTokens", self.completion_tokens))
        self.turn_seconds = float(counters.get("turnSeconds", self.turn_seconds))
        self.tool_seconds = float(counters.get("toolSeconds", self.tool_seconds))

    def finish(self, state: RunState, *, answer: str | None = None, error: str | None = None) -> None:
        """Move to a final state once; later calls are ignored (the first outcome stands)."""
        if self.done:
            return
        if state == "running":
            raise ValueError("finish() needs a final state")
        self.state = state
        self.answer = answer
        self.error = error
        self.finished_at = time.time()
        keep_answer(self)
        if self._on_finish is not None:
            self._on_finish(self)

    def complete_round(self, round_messages: list[dict[str, Any]], **extra: Any) -> None:
        """Append a completed tool round (the assistant message and its tool messages) to the
        conversation; it is journaled, with the counters as they stand now, as the point a
        resumed run restarts from. ``extra`` goes into the ``round`` record as it is (pods put
        the ids of the messages and events a round delivered there, so delivery and conversation
        are one record)."""
        self.messages.extend(round_messages)
        if self._on_round is not None:
            self._on_round(self, round_messages, extra)

    def reopen(self, message: dict[str, Any]) -> None:
        """A finished (completed or failed) run takes ``message`` (a ``user`` message) as a new
        turn: ``running`` again. The caller starts its loop. Raises ``ValueError`` for a run that
        is not idle or whose conversation was dropped."""
        if self.pod_state != "idle":
            raise ValueError(f"run {self.handle} is {self.pod_state}, not idle")
        if self.conversation_dropped:
            raise ValueError(CONVERSATION_DROPPED.format(handle=self.handle))
        self.state = "running"
        self.answer = self.error = None
        self.finished_at = None
        self.messages.append(message)

    def check_budgets(self, ahead: dict[str, float] | None = None) -> None:
        """Check the budgets of this run and its ancestors now; one that ran out, or that
        ``ahead`` (what is about to be used: ``{"toolCalls": 1}`` before a tool call,
        ``{"tokens": 1}`` before a turn) would pass, cancels its subtree, this run included
        (:func:`luftpause.runtime.runs.budgets.first_exceeded`)."""
        if self._on_budget_check is not None:
            self._on_budget_check(self, ahead)

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
        """Every spawn argument, so that a restart can rebuild the run."""
        return {
            "type": "start",
            "handle": self.handle,
            "at": self.started_at,
            "task": self.task,
            "system": self.system,
            "model": self.model,
            "serviceClass": self.service_class,
            "caller": self.caller,
            "maxToolCalls": self.max_tool_calls,
            "maxTokens": self.max_tokens,
            "parallelToolCalls": self.parallel_tool_calls,
            "tools": sorted(self.allowed_tools) if self.allowed_tools is not None else None,
            "parent": self.parent,
            "budgetTokens": self.budget_tokens,
            "budgetToolCalls": self.budget_tool_calls,
            "budgetSeconds": self.budget_seconds,
            "approveTools": sorted(self.approve_tools),
            "name": self.name,
            "orchestrate": self.orchestrate,
        }

    def compacted_record(self) -> dict[str, Any]:
        """A finished run as compaction writes it: one ``run`` record with its start and outcome,
        and either its conversation (``messages``, beyond the system and task messages) or, once
        dropped, ``conversationDropped``, ``outputs`` (the kept entries), ``outputsBase`` and
        ``taskChars``. Lists are copies: later changes to the run do not alter it."""
        record = {**self.start_record(), "type": "run", **self.outcome_record()}
        if self.conversation_dropped:
            record["conversationDropped"] = True
            record["outputs"] = list(self.kept_outputs or ())
            record["outputsBase"] = self.outputs_base
            record["taskChars"] = self.task_length
        else:
            record["messages"] = self.messages[2 if self.system else 1 :]
        return record

    def outcome_record(self) -> dict[str, Any]:
        """How the run ended (``state``, ``answer``?, ``error``?, ``exceeded``?, ``finishedAt``,
        ``counters``); the ``end`` record, and with :meth:`start_record` a compacted ``run``."""
        out: dict[str, Any] = {
            "state": self.state,
            "finishedAt": self.finished_at,
            "counters": self.counters(),
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
        task = str(record["task"])
        system = record.get("system")
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": task})
        tools = record.get("tools")
        service_class = record.get("serviceClass")
        return cls(
            handle=str(record["handle"]),
            task=task,
            model=str(record["model"]),
            service_class="batch" if service_class == "batch" else "interactive",
            caller=str(record.get("caller") or "anonymous"),
            max_tool_calls=int(record["maxToolCalls"]),
            max_tokens=int(record["maxTokens"]),
            parallel_tool_calls=bool(record.get("parallelToolCalls", False)),
            allowed_tools=frozenset(map(str, tools)) if tools is not None else None,
            messages=messages,
            system=system if isinstance(system, str) else None,
            parent=record.get("parent") if isinstance(record.get("parent"), str) else None,
            budget_tokens=_optional_int(record.get("budgetTokens")),
            budget_tool_calls=_optional_int(record.get("budgetToolCalls")),
            budget_seconds=_optional_float(record.get("budgetSeconds")),
            approve_tools=frozenset(map(str, record.get("approveTools") or ())),
            started_at=float(record["at"]),
            name=record.get("name") if isinstance(record.get("name"), str) else None,
            orchestrate=bool(record.get("orchestrate", False)),
            resumed=True,
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
        return run.outputs_base, list(run.kept_outputs or ())
    return 0, [
        m["content"]
        for m in run.messages
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]
    ]


def last_output(run: Run) -> str | None:
    """The run's newest output entry, found from the end (cheap for a long conversation)."""
    if run.conversation_dropped:
        return run.kept_outputs[-1] if run.kept_outputs else None
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
    run.task_chars = run.task_length
    run.task = summarize(run.task)
    run.system = None
    run.messages = []
    run.kept_outputs = kept
    run.outputs_base = base + len(entries) - len(kept)
    run.conversation_dropped = True


def keep_answer(run: Run) -> None:
    """A completed run's answer is the last message of its conversation, so that a ``send``
    continues from it and ``read`` shows it (not appended twice on replay)."""
    if run.state != "completed" or run.answer is None or run.conversation_dropped:
        return
    last = run.messages[-1] if run.messages else {}
    said = last.get("role") == "assistant" and not last.get("tool_calls")
    if not (said and last.get("content") == run.answer):
        run.messages.append({"role": "assistant", "content": run.answer})


def _optional_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _optional_float(value: Any) -> float | None:
    return float(value) if value is not None else None


def apply_outcome(run: Run, record: dict[str, Any]) -> None:
    """Put a journaled outcome (``end`` or compacted ``run`` record) on a replayed run, without
    the finish hooks (it is not news)."""
    state = record["state"]
    if state not in ("completed", "failed", "cancelled"):
        raise ValueError(f"not a final state: {state!r}")
    run.set_counters(record.get("counters") or {})
    run.state = state
    run.answer = record.get("answer")
    run.error = record.get("error")
    run.exceeded = record.get("exceeded")
    if record.get("stoppedBy") is not None:
        run.stopped_by = str(record["stoppedBy"])
    keep_answer(run)
    finished_at = record.get("finishedAt")
    run.finished_at = float(finished_at) if finished_at is not None else time.time()
