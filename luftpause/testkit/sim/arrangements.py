"""What stands between the agents and the engines: the arrangements a flood compares.

Each arrangement takes the agents' turns (:class:`~.workload.Sink`), places them on the pool's
engines (:class:`~.engines.EnginePool`) and tells the agents when each turn's reply has ended
(:class:`~.engines.Listener`). This module has the two that make no decision of their own beyond
routing:

* :class:`Direct`: each agent talks to one engine, agents dealt round-robin (the sanity floor);
* :class:`Router`: SGLang's router 0.3.2, ``cache_aware`` (:mod:`.router`), every turn straight
  into the chosen engine's queue.

The others: :class:`~.gateway.Gateway` (SGLang Model Gateway with sticky sessions and its priority
scheduler), :class:`~.thunderagent.ThunderAgent` (its ``tr`` capacity scheduler),
:class:`~.continuum.Continuum` (Continuum's engines behind the router) and
:class:`~.scheduler.Luftpause` (the real scheduler core).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import EnginePool, Usage
from luftpause.testkit.sim.router import CacheAwareRouter
from luftpause.testkit.sim.workload import Agents, Run, Turn

if TYPE_CHECKING:
    from luftpause.testkit.sim.replay import Replay


class Arrangement:
    """The common part: the pool, the clock and the agents to answer."""

    name = "arrangement"

    def __init__(self, clock: VirtualClock, pool: EnginePool) -> None:
        self.clock = clock
        self.pool = pool
        self.agents: Agents | Replay | None = None

    def attach(self, agents: Agents | Replay) -> None:
        """Answer ``agents`` (their :meth:`Agents.finished` and :meth:`Agents.failed`)."""
        self.agents = agents

    def start(self) -> None:
        """Arm whatever the arrangement does on its own clock (probes, ticks); nothing by default."""

    def send(self, turn: Turn, now: float) -> None:
        raise NotImplementedError

    def end_run(self, run: Run, now: float) -> None:
        """``DELETE /v1/runs/{id}``: nothing to do for an arrangement that keeps no run state."""

    def first_token(self, turn: Turn, replica: int, now: float) -> None:
        """A turn's first token: nothing to do unless the arrangement watches it."""

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None:
        assert self.agents is not None
        self.agents.finished(turn, usage.prompt_tokens, usage.cached_tokens)

    def counters(self) -> dict[str, int]:
        """What the arrangement counted, for the report."""
        return {}


class Direct(Arrangement):
    """Agent ``k`` of the flood (counted over every group, in order) always talks to engine
    ``k mod replicas``."""

    name = "direct"

    def __init__(self, clock: VirtualClock, pool: EnginePool) -> None:
        super().__init__(clock, pool)
        self._agent_index: dict[tuple[int, int], int] = {}

    def attach(self, agents: Agents | Replay) -> None:
        super().attach(agents)
        index = 0
        for group_index, group in enumerate(agents.shape.groups):
            for agent in range(group.agents):
                self._agent_index[(group_index, agent)] = index
                index += 1

    def send(self, turn: Turn, now: float) -> None:
        replica = self._agent_index[(turn.run.group, turn.run.agent)] % len(self.pool)
        self.pool.submit(replica, turn, self)


class Router(Arrangement):
    """SGLang's router 0.3.2 with ``--policy cache_aware`` and its defaults (:mod:`.router`)."""

    name = "router"

    def __init__(self, clock: VirtualClock, pool: EnginePool) -> None:
        super().__init__(clock, pool)
        self.router = CacheAwareRouter(len(pool))

    def send(self, turn: Turn, now: float) -> None:
        self.pool.submit(self.router.route(turn.prompt), turn, self)

    def finished(self, turn: Turn, replica: int, usage: Usage, now: float) -> None:
        self.router.done(replica)
        super().finished(turn, replica, usage, now)
