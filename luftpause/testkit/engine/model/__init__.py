"""A step-level model of an LLM engine under memory pressure, in virtual time (sans-IO).

It models what makes a prefix cache, and so affinity, matter on SGLang and vLLM:

* **engine time is shared**: the engine runs in steps; each computes a bounded budget of tokens
  (one per decoding request, chunks of prompts being prefilled) and lasts longer the more tokens
  it computes and the more KV its requests read, so a cache miss slows every running request;
* **one KV pool in tokens**, shared by running requests and the prefix cache: a waiting request
  is admitted only when the pool has room for its uncached prompt and its reservation (SGLang:
  ``max_tokens`` x the new-token ratio; vLLM: allocated as it computes); short of room,
  unpinned cached prefixes are evicted least recently used, leaves first, while prefixes that
  running requests use stay pinned; then running requests are retracted (SGLang) or preempted
  (vLLM) and recomputed later.

Modules: :mod:`.requests` (what goes in and out), :mod:`.engine` (:class:`EngineModel`),
:mod:`.kv_pool` (pool and prefix tree), :mod:`.state` (requests and shared transitions),
:mod:`.sglang_style`, :mod:`.vllm_style`, :mod:`.llamacpp_style` (the schedulers),
:mod:`.profiles` (named, derived parameter sets).

Use::

    engine = EngineModel(profile("sglang-llama-3.2-1b-fp8-8gb"))
    engine.submit(EngineRequest("r1", prompt_path, output_tokens=256, reply=reply_node), now=0.0)
    while (t := engine.next_event_time()) is not None:
        for event in engine.advance(t):
            ...  # RequestAdmitted, FirstTokenGenerated, RequestFinished, RequestRetracted

Pure: no asyncio, no clock, no randomness.
"""

from __future__ import annotations

from luftpause.testkit.engine.model.engine import EngineModel
from luftpause.testkit.engine.model.kv_pool import KVPool
from luftpause.testkit.engine.model.profiles import (
    PROFILES,
    STYLES,
    EngineProfile,
    ModelShape,
    StepCosts,
    profile,
)
from luftpause.testkit.engine.model.requests import (
    EngineEvent,
    EngineLoad,
    EngineRequest,
    FirstTokenGenerated,
    PrefixNode,
    RequestAdmitted,
    RequestFinished,
    RequestRetracted,
)
from luftpause.testkit.engine.model.state import PRIORITY_ORDERS
from luftpause.testkit.engine.prefix_cache import PrefixPath

__all__ = [
    "PRIORITY_ORDERS",
    "PROFILES",
    "STYLES",
    "EngineEvent",
    "EngineLoad",
    "EngineModel",
    "EngineProfile",
    "EngineRequest",
    "FirstTokenGenerated",
    "KVPool",
    "ModelShape",
    "PrefixNode",
    "PrefixPath",
    "RequestAdmitted",
    "RequestFinished",
    "RequestRetracted",
    "StepCosts",
    "profile",
]
