"""What one pass of ``bench/flood.py`` sends, and the simulated engines it runs on: from the
script's flags, or from a load shape file (``--shape FILE.toml``, the files ``bench/flood_sim.py``
runs in virtual time, parsed by :mod:`luftpause.testkit.sim.shapes`).

A shape file maps onto a live pass so:

* ``groups``: one group of own-loop agents each (``agents``, ``class``, ``caller``, its own
  ``tool_rounds``, its ``tool_seconds`` drawn per tool call from the file's distribution; each
  agent's draws seeded by the pass's seed, its group and its number); ``context_tokens`` is each
  run's system prompt (the simulated engines count 4 characters a token, so their count is the
  file's), ``reply_tokens`` each turn's ``max_tokens``, ``duration_s`` each pass's window;
* ``seeds``: one repetition per seed (``--repeat`` more goes round them again);
* ``replicas``, ``slots``, ``profile`` and ``[engine]``: the simulated engines, every arrangement's
  alike: ``fake-engine --profile PROFILE`` (:func:`shape_engine_args`) with ``--max-running
  SLOTS`` (``"none"``: the profile's own bound), ``--pool-tokens`` the profile's pool times
  ``pool_scale``, ``--schedule-policy lpm`` for ``queue = "lpm"``, and for ``queue = "priority"``
  SGLang's order by a higher ``priority`` first (vLLM's lower first for a vLLM profile) with each
  agent sending its class's priority (:data:`luftpause.testkit.sim.engines.CLASS_PRIORITY`);
* ``via = "mcp"``: luftpause's runs are sub-agents over MCP, their tool the fake MCP server's
  ``lookup`` (its own 10-50 ms, not the file's ``tool_seconds``), as ``flood.py --via mcp``.

On real engines (``--engine llama-server``) the file gives the agents, the replicas and the slots
(``--parallel``); a profile's pool, queue order and priority are the simulator's and are refused
there unless left at their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pools import SMG_HEADERS  # bench/ is on sys.path: this script's directory

from luftpause.testkit.engine.model.profiles import profile
from luftpause.testkit.load.agents import AgentGroup
from luftpause.testkit.sim.engines import CLASS_PRIORITY
from luftpause.testkit.sim.shapes import ShapeFile
from luftpause.testkit.sim.workload import AgentGroup as ShapeGroup

CALLERS = {"own_loop": ("ide", "bulk"), "mcp": ("claude-code", "batch-orchestrator")}
"""The interactive and batch callers of the built-in load, as the virtual-time floods name them."""


@dataclass(frozen=True)
class Load:
    """What one pass sends; times in seconds, sizes in tokens. ``shape_groups``: a shape file's
    groups, sent instead of ``batch_agents`` and ``interactive_agents``; ``priority_sign``: each
    agent sends its class's priority times this (0: no priority sent)."""

    batch_agents: int
    interactive_agents: int
    duration_s: float
    tool_rounds: int
    context_tokens: int
    tool_seconds: float
    max_tokens: int
    tool_rounds_by: str = "model"
    via: str = "own_loop"
    shape_groups: tuple[ShapeGroup, ...] = field(default=())
    priority_sign: int = 0

    @property
    def interactive(self) -> int:
        """Interactive agents in the pass (SGLang Model Gateway's interactive floor)."""
        if self.shape_groups:
            return sum(g.agents for g in self.shape_groups if g.service_class == "interactive")
        return self.interactive_agents

    def light(self) -> Load:
        """The light-load control: the same pass without its batch agents."""
        groups = tuple(g for g in self.shape_groups if g.service_class != "batch")
        return replace(self, batch_agents=0, shape_groups=groups)

    def groups(self, arrangement: str = "") -> list[AgentGroup]:
        """The agent groups; through SGLang Model Gateway each also sends its ``x-smg-priority``,
        through ThunderAgent its run as ``program_id``."""
        program = arrangement == "thunderagent"

        def group(
            agents: int, service_class: str, caller: str, source: ShapeGroup | None = None
        ) -> AgentGroup:
            headers = (("x-smg-priority", SMG_HEADERS[service_class]),) if arrangement == "smg" else ()
            priority = CLASS_PRIORITY[service_class] * self.priority_sign if self.priority_sign else None
            return AgentGroup(
                agents,
                service_class,
                caller,
                headers,
                program,
                tool_rounds=source.tool_rounds if source else None,
                tool_seconds=source.tool_seconds if source else None,
                priority=priority,
            )

        if self.shape_groups:
            return [group(g.agents, g.service_class, g.caller, g) for g in self.shape_groups]
        interactive, batch = CALLERS[self.via]
        groups = [group(self.interactive_agents, "interactive", interactive)]
        if self.batch_agents:
            groups.append(group(self.batch_agents, "batch", batch))
        return groups

    def spawned(self, arrangement: str) -> bool:
        """Whether ``arrangement``'s runs are sub-agents spawned over MCP: luftpause's, with
        ``via="mcp"``; the others (router, gateway, direct) get own-loop agents of the same shape."""
        return self.via == "mcp" and arrangement.startswith("luftpause")


def shape_load(shape: ShapeFile, duration_s: float, tool_rounds_by: str = "model") -> Load:
    """The live :class:`Load` of ``shape`` (module docstring), each pass ``duration_s`` long."""
    load = shape.load
    sign = 0
    if shape.queue == "priority":
        sign = -1 if profile(shape.profile).style == "vllm" else 1
    return Load(
        batch_agents=sum(g.agents for g in load.groups if g.service_class == "batch"),
        interactive_agents=sum(g.agents for g in load.groups if g.service_class == "interactive"),
        duration_s=duration_s,
        tool_rounds=load.tool_rounds,
        context_tokens=load.context_tokens,
        tool_seconds=load.tool_seconds,
        max_tokens=load.reply_tokens,
        tool_rounds_by=tool_rounds_by,
        via=load.groups[0].via,
        shape_groups=load.groups,
        priority_sign=sign,
    )


def shape_engine_args(shape: ShapeFile, model_rounds: int, time_scale: float) -> list[str]:
    """``fake-engine`` flags for every replica of ``shape`` (module docstring); ``model_rounds``:
    the simulated model's tool rounds before it answers (0 when the agents make them)."""
    engine = profile(shape.profile)
    args = ["--profile", shape.profile, "--tool-rounds", str(model_rounds), "--time-scale", str(time_scale)]
    if shape.slots is not None:
        args += ["--max-running", str(shape.slots)]
    if shape.pool_scale != 1.0:
        args += ["--pool-tokens", str(round(engine.pool_tokens * shape.pool_scale))]
    if shape.queue == "lpm":
        args += ["--schedule-policy", "lpm"]
    if shape.queue == "priority":
        args += ["--priority", "lower_first" if engine.style == "vllm" else "higher_first"]
    return args


def real_engine_refusal(shape: ShapeFile) -> str | None:
    """Why ``shape`` cannot run on real engines (a simulator-only setting), or ``None``."""
    if shape.queue != "fcfs" or shape.pool_scale != 1.0:
        return (
            f"{shape.name}: [engine] queue and pool_scale set the simulated engines; a real engine's "
            "are its own (leave them at fcfs and 1.0 for --engine llama-server)"
        )
    if shape.slots is None:
        return f'{shape.name}: slots = "none" has no meaning for llama-server; name its --parallel slots'
    if shape.load.groups[0].via == "mcp":
        return f'{shape.name}: via = "mcp" runs on the simulator only'
    return None
