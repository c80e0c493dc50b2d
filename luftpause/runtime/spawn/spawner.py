"""The one spawn path: every run, whoever asks for it, is checked, recorded and started here.

Two kinds of spawner reach it (:class:`~luftpause.runtime.pods.actors.Actor`): an MCP caller
(the ``spawn`` and ``run`` tools; ``parent`` may name a run to spawn under) and a sub-agent through
its built-in ``spawn`` (:mod:`luftpause.runtime.spawn.builtin_tools`; its parent is itself). Both
give :class:`~luftpause.runtime.runs.spec.SpawnArguments`; :meth:`Spawner.spawn` resolves them
into the run's :class:`~luftpause.runtime.runs.spec.RunSpec`, in this order, refusing with
:class:`~luftpause.runtime.errors.SpawnRefused` (or the pods' and scopes' refusals) before
anything is recorded:

1. the parent: it must be held, not cancelled, not stopped; a sub-agent's child is narrowed to its
   spawner's limits (:func:`child_arguments`), an MCP caller's child under a parent to its tools
   and approval list, and refused when it asks a budget larger than the parent's chain allows
   (:func:`check_budgets`; the subtree's budget would bound it anyway, so it is said, not hidden);
2. the model: among the generative replicas' models (:class:`~luftpause.runtime.errors.UnknownModel`);
3. the system prompt: inline ``system``, a named ``instruction``, or the default instruction
   (:mod:`luftpause.runtime.spawn.instructions`);
4. the tool names of ``tools`` and ``approveTools``: known to the upstream servers (while they
   are all reachable);
5. the tree's limits and the name (:mod:`luftpause.runtime.pods.tree`) and the scope
   (:mod:`luftpause.runtime.pods.scopes`).

Then the run is added to the registry (its ``start`` record journaled), its level and scope
recorded, and it is started: the registry drives it with the sub-agent loop it serves with.

A sub-agent's child (:func:`child_arguments`) may be given another model (any of the pool's),
reply length, service class, tool budget and budgets, within its spawner's: ``maxTokens`` at most
the spawner's (when the spawner's is bounded), ``maxToolCalls`` at most the spawner's (default:
the smaller of 8 and it), ``serviceClass`` ``batch`` under a batch spawner (a batch run's child
cannot jump the queue), ``parallelToolCalls`` only where the spawner has it, each budget at most
the tightest same budget of the spawner and its ancestors, ``tools`` a subset of the spawner's,
and the spawner's ``approveTools`` plus any it names. What it does not give it inherits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from luftpause.runtime.agent import spans
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.errors import RuntimeFault, SpawnRefused, UnknownModel
from luftpause.runtime.pods.actors import Actor
from luftpause.runtime.pods.scopes import RunScopes
from luftpause.runtime.pods.tree import TreeLimits
from luftpause.runtime.runs.record import Run, new_handle
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.spec import DEFAULT_MAX_TOOL_CALLS, RunSpec, SpawnArguments
from luftpause.runtime.runs.tenants import spawned_tenant
from luftpause.runtime.spawn.instructions import Instructions

_BUDGETS = (
    ("budget_tokens", "budgetTokens"),
    ("budget_tool_calls", "budgetToolCalls"),
    ("budget_seconds", "budgetSeconds"),
)


def inherited_tools(spawner: Run, tools: Iterable[str] | None, who: str) -> list[str] | None:
    """The tools a child of ``spawner`` may use: ``tools`` (names) when the spawner may use them
    all, the spawner's own when ``tools`` is None; ``None`` means every tool. Tools only narrow down
    a run tree, whoever spawns into it. Raises :class:`SpawnRefused` naming the tools beyond the
    spawner's (``who`` says whose they are in the message: ``"you"``, ``"the parent run 'x'"``)."""
    allowed = spawner.spec.allowed_tools
    if tools is None:
        return sorted(allowed) if allowed is not None else None
    if allowed is not None and (wider := sorted(set(tools) - allowed)):
        raise SpawnRefused(f"tools: {', '.join(wider)} not among the tools {who} may use")
    return list(tools)


def inherited_approvals(spawner: Run, approve_tools: Iterable[str] | None) -> list[str]:
    """The tools whose calls wait for approval in a child of ``spawner``: the spawner's plus
    ``approve_tools`` (what needs approval for the spawner needs it for the child)."""
    return sorted(spawner.spec.approval_tools | set(approve_tools or ()))


def check_budgets(arguments: SpawnArguments, chain: Sequence[Run], own: str) -> None:
    """Refuse a child's budgets (tokens, tool calls, seconds) larger than the tightest same budget
    of ``chain`` (its parent and the parent's held ancestors, nearest first), which bounds the
    child's subtree anyway: a spawn that asks more is told so rather than clamped silently.
    ``own`` names the parent's budget in the message (``"your own"``, ``"the parent run 'x''s"``).
    Raises :class:`SpawnRefused` naming the budget, what was asked and the bound."""
    for field, wire in _BUDGETS:
        asked = getattr(arguments, field)
        if asked is None:
            continue
        bounds = [(run, getattr(run.spec, field)) for run in chain if getattr(run.spec, field) is not None]
        if bounds:
            holder, limit = min(bounds, key=lambda pair: pair[1])
            if asked > limit:
                whose = own if holder is chain[0] else f"run {holder.handle}'s"
                raise SpawnRefused(
                    f"{wire}: {asked:g} is more than {whose} ({limit:g}), which bounds the child anyway; "
                    "a child may only narrow it"
                )


def child_arguments(spawner: Run, arguments: SpawnArguments, chain: Sequence[Run]) -> SpawnArguments:
    """A sub-agent's own spawn narrowed to ``spawner``'s limits (module docstring); ``chain`` is
    the spawner and its held ancestors, nearest first (their budgets bound the child). Raises
    :class:`SpawnRefused` saying which argument asks more than the spawner has."""
    spec = spawner.spec
    given = arguments.model_fields_set
    if arguments.parent is not None:
        raise SpawnRefused("parent: a sub-agent's child is always its own; leave parent out")

    def wider(what: str, asked: Any, own: Any) -> SpawnRefused:
        return SpawnRefused(f"{what}: {asked} is more than your own ({own}); a child may only narrow it")

    max_calls = (
        arguments.max_tool_calls
        if "max_tool_calls" in given
        else min(DEFAULT_MAX_TOOL_CALLS, spec.max_tool_calls)
    )
    if max_calls > spec.max_tool_calls:
        raise wider("maxToolCalls", max_calls, spec.max_tool_calls)
    max_tokens = arguments.max_tokens if "max_tokens" in given else spec.max_tokens
    if spec.max_tokens > 0 and not 0 < max_tokens <= spec.max_tokens:
        asked = "0 (the engine's default)" if max_tokens == 0 else max_tokens
        raise wider("maxTokens", asked, spec.max_tokens)
    service_class = arguments.service_class if "service_class" in given else spec.service_class
    if spec.service_class == "batch" and service_class != "batch":
        raise SpawnRefused(
            "serviceClass: a batch run's child is batch too; it cannot jump the queue as interactive"
        )
    parallel = arguments.parallel_tool_calls if "parallel_tool_calls" in given else spec.parallel_tool_calls
    if parallel and not spec.parallel_tool_calls:
        raise wider("parallelToolCalls", "true", "false")
    check_budgets(arguments, chain, "your own")
    return arguments.model_copy(
        update={
            "model": arguments.model if "model" in given and arguments.model else spec.model,
            "max_tool_calls": max_calls,
            "max_tokens": max_tokens,
            "service_class": service_class,
            "parallel_tool_calls": parallel,
            "tools": inherited_tools(spawner, arguments.tools, "you"),
            "approve_tools": inherited_approvals(spawner, arguments.approve_tools),
        }
    )


class Spawner:
    """Checks, records and starts runs (module docstring). One per runtime."""

    def __init__(
        self,
        *,
        registry: RunRegistry,
        upstream: UpstreamPool,
        scopes: RunScopes,
        tree: TreeLimits,
        instructions: Instructions,
        models: Sequence[str],
        default_model: str,
    ) -> None:
        self.registry = registry
        self.upstream = upstream
        self.scopes = scopes
        self.tree = tree
        self.instructions = instructions
        self.models = list(models)
        """The models a sub-agent can run on: those of generative replicas, in configuration order
        (a single-pass replica cannot answer a chat turn)."""
        self.default_model = default_model

    def model_schema(self) -> dict[str, Any]:
        """JSON Schema of spawn's ``model`` as this spawner takes it: one of :attr:`models` (an
        enum), or ``null`` (or left out) for :attr:`default_model`. The input schemas of the MCP
        ``spawn`` and ``run`` and of a sub-agent's built-in ``spawn`` show it, so a client and its
        model see which names are valid; a name outside it is refused by :meth:`spawn`, listing
        :attr:`models`. With no model served, a string of any value."""
        served = {"type": "string", "enum": list(self.models)} if self.models else {"type": "string"}
        listed = ", ".join(map(repr, self.models)) or "none"
        described = f"the model it runs on, one of those served ({listed}); default: {self.default_model!r}"
        return {"anyOf": [served, {"type": "null"}], "description": described}

    def spawn(self, arguments: SpawnArguments, by: Actor, *, trace: Any = None) -> Run:
        """Check ``arguments`` of a spawn by ``by``, record the run and start it; the running run.
        ``trace`` is the MCP request's SDK ``Context`` (where the run's ``invoke_agent`` span
        belongs; ``None`` for a sub-agent's child). Raises :class:`SpawnRefused`,
        :class:`UnknownModel` and the pods' refusals (:mod:`luftpause.runtime.errors`)."""
        parent, arguments = self._parent(arguments, by)
        caller = by.caller or "anonymous"
        model = arguments.model or self.default_model
        if model not in self.models:
            # Refused here, at once: the dataplane would refuse every turn of it with a 404 anyway.
            raise UnknownModel(model, self.models)
        system, instruction = self.instructions.resolve(arguments.instruction, arguments.system)
        named = set(arguments.tools or ()) | set(arguments.approve_tools or ())
        if named:
            known = self.upstream.known_tool_names()
            unknown = sorted(named - known) if known is not None else []
            if unknown:
                listed = ", ".join(map(repr, unknown))
                raise SpawnRefused(f"unknown tool(s) {listed}; known: {', '.join(sorted(known or ()))}")
        siblings = (
            self.registry.children(parent)
            if parent is not None
            else [r for r in self.registry.of_caller(caller) if r.parent is None]
        )
        level = self.tree.check_spawn(parent, arguments.name, siblings)
        handle = new_handle()
        plan = self.scopes.plan(parent, arguments.scope, handle)
        try:
            run = self._add(handle, parent, arguments, model, system, instruction, caller, by)
        except BaseException:
            self.scopes.abandon(plan)  # a root grant recorded for runtimes sharing the store
            raise
        self.tree.record(run, level)
        self.scopes.grant(run, plan)
        spans.spawned(run, trace)  # where its invoke_agent span belongs, when tracing
        self.registry.start(run)
        return run

    def _add(
        self,
        handle: str,
        parent: Run | None,
        arguments: SpawnArguments,
        model: str,
        system: str | None,
        instruction: str | None,
        caller: str,
        by: Actor,
    ) -> Run:
        """Record the new run ``handle`` in the registry (not started)."""
        spec = RunSpec.model_validate(
            {
                **arguments.model_dump(by_alias=False, exclude={"scope"}),
                "model": model,
                "system": system,
                "instruction": instruction,
                "parent": parent.handle if parent is not None else None,
                "caller": caller,
                # A sub-agent's child is its spawner's tenant's; an MCP caller's run its key's.
                "tenant": by.run.spec.tenant if by.run is not None else spawned_tenant(by.tenant),
                "approve_tools": sorted(arguments.approve_tools or ()),
            }
        )
        return self.registry.add(Run.new(handle, spec))

    def _parent(self, arguments: SpawnArguments, by: Actor) -> tuple[Run | None, SpawnArguments]:
        """The new run's parent and its arguments narrowed as that parent requires."""
        if by.run is not None:
            chain = list(self._chain(by.run))
            return by.run, child_arguments(by.run, arguments, chain)
        if arguments.parent is None:
            return None, arguments
        handle = arguments.parent
        try:
            parent = self.registry.get_for(handle, by.tenant)
        except RuntimeFault as exc:
            raise SpawnRefused(f"parent: {exc}") from None
        if parent.state == "cancelled":
            raise SpawnRefused(f"parent run {handle!r} is cancelled; its subtree takes no new runs")
        if parent.pod_state == "stopped":
            raise SpawnRefused(f"parent run {handle!r} is stopped; its subtree takes no new runs")
        # As a sub-agent's own spawn does: the parent's tools or fewer, its approval list and more,
        # budgets no larger than the tightest on its way up (refused, not clamped in silence).
        check_budgets(arguments, list(self._chain(parent)), f"the parent run {handle!r}'s")
        tools = inherited_tools(parent, arguments.tools, f"the parent run {handle!r}")
        approve = inherited_approvals(parent, arguments.approve_tools)
        return parent, arguments.model_copy(update={"tools": tools, "approve_tools": approve})

    def _chain(self, run: Run) -> Iterable[Run]:
        """``run`` and its held ancestors, nearest first."""
        seen: set[str] = set()
        current: Run | None = run
        while current is not None and current.handle not in seen:
            seen.add(current.handle)
            yield current
            current = self.registry.find(current.parent) if current.parent is not None else None
