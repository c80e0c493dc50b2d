"""The engine simulator behind ``luftpause fake-engine``
(entry point: :mod:`luftpause.testkit.commands.fake_engine`).

* :mod:`.settings`: what an engine serves and how fast it is (``EngineSettings``);
* :mod:`.backend`: the seam between the routes and engine time, with two models behind it:
  :mod:`.slotted` (the default: running slots and a waiting queue, each request sleeping its own
  prefill and decode) and :mod:`.stepped` (``--profile``: the step model of :mod:`.model` in real
  time: one KV pool shared by running requests and the prefix cache, steps shared by all);
* :mod:`.model`: the sans-IO, virtual-time engine model (SGLang's, vLLM's and llama.cpp's
  scheduling, the KV pool and its prefix tree, named profiles);
* :mod:`.scheduling`: running slots and the waiting queue (FIFO or by priority), with the counters
  (``EngineStats``);
* :mod:`.prefix_cache`: the slot model's prefix cache, bounded in tokens with LRU eviction, keyed
  by the request's message prefix (the step model keys its nodes the same way);
* :mod:`.costs`: prompt tokens, and prefill time of the tokens the prefix cache did not hold plus
  decode time that grows with the running batch;
* :mod:`.recording`: what ``/testkit/*`` can still show of the requests answered;
* :mod:`.replies`: what the simulated model says (tool rounds, then a final answer);
* :mod:`.toolargs`: tool-call arguments valid against a JSON Schema;
* :mod:`.wire`: the OpenAI chat completions wire format (requests, chunks, errors);
* :mod:`.classify`: vLLM's ``/classify`` for a single-pass replica;
* :mod:`.metrics`: ``/metrics`` under SGLang's or vLLM's names, through ``prometheus_client``;
* :mod:`.faults`: misbehaviour on demand (refusals, cut streams, error events mid-stream, stalls,
  slow streams, closed connections), per request (``"luftpause_fault"`` in the body) or for a
  seeded fraction of requests;
* :mod:`.idle_close`: an idle close of kept-alive connections that crosses the client's next
  request, made certain (``idle_close_ms``);
* :mod:`.sending`: how an answer's bytes are written, paced, or broken off (a fault's cut);
* :mod:`.server`: the aiohttp routes, ``start_engine`` and ``RunningEngine``.
"""

from __future__ import annotations

from luftpause.testkit.engine.scheduling import EngineStats
from luftpause.testkit.engine.server import RunningEngine, SimulatedEngine, start_engine
from luftpause.testkit.engine.settings import EngineSettings

__all__ = ["EngineSettings", "EngineStats", "RunningEngine", "SimulatedEngine", "start_engine"]
