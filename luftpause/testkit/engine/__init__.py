"""The engine simulator behind ``luftpause fake-engine`` (entry point: :mod:`luftpause.testkit.fake_engine`).

* :mod:`.settings`: what an engine serves and how fast it is (``EngineSettings``);
* :mod:`.scheduling`: running slots and the FIFO waiting queue, with the counters (``EngineStats``);
* :mod:`.costs`: prompt tokens, prefill and decode time (where a prefix cache and batch-size
  effects would act);
* :mod:`.replies`: what the simulated model says (tool rounds, then a final answer);
* :mod:`.toolargs`: tool-call arguments valid against a JSON Schema;
* :mod:`.wire`: the OpenAI chat completions wire format (requests, chunks, errors);
* :mod:`.metrics`: ``/metrics`` with SGLang's names, through ``prometheus_client``;
* :mod:`.faults`: misbehaviour on demand (refusals, cut streams, stalls, slow streams, closed
  connections), per request (``"luftpause_fault"`` in the body) or for a seeded fraction of requests;
* :mod:`.server`: the aiohttp routes, ``start_engine`` and ``RunningEngine``.
"""

from __future__ import annotations

from luftpause.testkit.engine.scheduling import EngineStats
from luftpause.testkit.engine.server import RunningEngine, SimulatedEngine, start_engine
from luftpause.testkit.engine.settings import EngineSettings

__all__ = ["EngineSettings", "EngineStats", "RunningEngine", "SimulatedEngine", "start_engine"]
