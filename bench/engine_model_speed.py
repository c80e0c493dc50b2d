"""How fast the engine model steps in virtual time at the size of issue 12's flood (SIMULATED).

Two replicas of a profile (default: ``sglang-llama-3.2-1b-fp8-8gb``), 52 closed-loop agents
pinned half to each (48 batch + 4 interactive in the published table; all alike here), each run:
a fresh ~8,000-character context (2,000 tokens), up to 3 tool calls (seeded), 256 reply tokens a
turn, a tool result of 500 tokens and a tool pause of 1-5 s between turns; a finished run starts
the next at once. A minimal discrete-event loop (no scheduler, no policy: that is the flood
harness's job) advances both engines and the agents to whichever comes first.

Prints virtual seconds simulated per wall second (the figure that says whether a 3-minute flood
runs in seconds), engine steps per wall second, and what the engines did (turns, retractions,
prefix-cache hit rate), for each profile given::

    .venv/bin/python bench/engine_model_speed.py [--duration-s 180] [--agents 52] [--repeat 3]
        [--profile NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from luftpause.testkit.engine.model import (
    PROFILES,
    EngineModel,
    EngineRequest,
    PrefixPath,
    RequestFinished,
    RequestRetracted,
)

CONTEXT_TOKENS = 2000  # ~8,000 characters at 4 characters a token
REPLY_TOKENS = 256
TOOL_RESULT_TOKENS = 500


def _key(*parts: object) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


@dataclass
class Agent:
    """One closed-loop agent: its replica, its current run's prompt, tool calls left."""

    name: str
    replica: int
    rng: random.Random
    runs: int = 0
    turns: int = 0
    prompt: PrefixPath = field(default_factory=lambda: PrefixPath(()))
    calls_left: int = 0

    def new_run(self) -> None:
        self.runs += 1
        self.prompt = PrefixPath(((_key(self.name, self.runs, "context"), CONTEXT_TOKENS),))
        self.calls_left = self.rng.randint(0, 3)

    def request(self) -> EngineRequest:
        self.turns += 1
        reply = (_key(self.name, self.runs, self.turns, "reply"), REPLY_TOKENS)
        return EngineRequest(f"{self.name}-{self.turns}", self.prompt, REPLY_TOKENS, reply=reply)

    def after_reply(self, reply: tuple[bytes, int]) -> bool:
        """The turn ended: True when the run goes on after a tool call (prompt extended)."""
        if self.calls_left == 0:
            return False
        self.calls_left -= 1
        result = (_key(self.name, self.runs, self.turns, "tool"), TOOL_RESULT_TOKENS)
        self.prompt = PrefixPath((*self.prompt.nodes, reply, result))
        return True


def flood(profile_name: str, duration_s: float, agents: int, seed: int) -> dict[str, float]:
    """One flood; its figures."""
    profile = PROFILES[profile_name]
    engines = [EngineModel(profile), EngineModel(profile)]
    rng = random.Random(seed)
    crowd = [Agent(f"agent{i}", i % 2, random.Random(rng.random())) for i in range(agents)]
    by_request: dict[str, tuple[Agent, EngineRequest]] = {}
    wakeups: list[tuple[float, int]] = []  # (time, agent index)
    for index, agent in enumerate(crowd):
        agent.new_run()
        heapq.heappush(wakeups, (rng.uniform(0.0, 1.0), index))
    finished = retracted = runs_done = 0
    started = time.perf_counter()
    now = 0.0
    while now < duration_s:
        moments = [t for t in (e.next_event_time() for e in engines) if t is not None]
        if wakeups:
            moments.append(wakeups[0][0])
        if not moments:
            break
        now = min(moments)
        for engine in engines:
            for event in engine.advance(now):
                if isinstance(event, RequestRetracted):
                    retracted += 1
                if not isinstance(event, RequestFinished):
                    continue
                finished += 1
                agent, request = by_request.pop(event.request_id)
                assert request.reply is not None
                if agent.after_reply(request.reply):
                    pause = agent.rng.uniform(1.0, 5.0)
                else:
                    runs_done += 1
                    agent.new_run()
                    pause = 0.0
                heapq.heappush(wakeups, (now + pause, crowd.index(agent)))
        while wakeups and wakeups[0][0] <= now:
            _, index = heapq.heappop(wakeups)
            agent = crowd[index]
            request = agent.request()
            by_request[request.request_id] = (agent, request)
            engines[agent.replica].submit(request, now)
    wall = time.perf_counter() - started
    loads = [engine.load() for engine in engines]
    queried = sum(load.prompt_tokens_total for load in loads)
    return {
        "virtual_s": now,
        "wall_s": wall,
        "virtual_per_wall": now / wall,
        "steps_per_wall_s": sum(engine.steps for engine in engines) / wall,
        "turns_finished": finished,
        "runs_finished": runs_done,
        "retractions": retracted,
        "hit_rate": sum(load.cached_tokens_total for load in loads) / queried if queried else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--duration-s", type=float, default=180.0, help="virtual seconds (default: %(default)s)"
    )
    parser.add_argument("--agents", type=int, default=52, help="closed-loop agents (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="floods per profile (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first flood (default: %(default)s)")
    parser.add_argument(
        "--profile",
        action="append",
        choices=sorted(PROFILES),
        default=None,
        help="a profile to run; repeat for several (default: the SGLang and vLLM GPU profiles)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    names = args.profile or ["sglang-llama-3.2-1b-fp8-8gb", "vllm-llama-3.2-1b-fp8-8gb"]
    print(f"SIMULATED engines; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    report: dict[str, list[dict[str, float]]] = {}
    for name in names:
        report[name] = [flood(name, args.duration_s, args.agents, args.seed + i) for i in range(args.repeat)]
        rows = report[name]
        median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        print(
            f"{name}: {median['virtual_s']:.0f} virtual s in {median['wall_s']:.2f} wall s "
            f"(median of {len(rows)}): {median['virtual_per_wall']:.0f} virtual s per wall s, "
            f"{median['steps_per_wall_s']:.0f} steps/s; {median['turns_finished']:.0f} turns, "
            f"{median['runs_finished']:.0f} runs, {median['retractions']:.0f} retractions, "
            f"hit rate {median['hit_rate']:.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"simulated": True, "floods": report}, indent=2))


if __name__ == "__main__":
    main()
