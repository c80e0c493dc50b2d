"""The test kit, shipped with luftpause (as ``trio.testing`` is with trio), in folders by purpose.

* :mod:`.engine`: the engine simulator (the aiohttp server standing in for SGLang/vLLM, and the
  sans-IO engine models of :mod:`.engine.model` that also run in virtual time);
* :mod:`.sim`: floods in virtual time: agents, arrangements and engine models on one clock;
* :mod:`.launch`: processes on free loopback ports (:mod:`.launch.procs`), a whole stack
  (:mod:`.launch.stack`), llama.cpp's ``llama-server`` (:mod:`.launch.llama_server`) and an app on
  a thread of its own (:mod:`.launch.threaded_app`);
* :mod:`.load`: the agents that make load through the proxy or over MCP, and their summary;
* :mod:`.fakes`: stand-ins for what luftpause talks to: MCP tool servers over HTTP and stdio, an
  OTLP trace receiver;
* :mod:`.commands`: the user commands ``luftpause fake-engine`` (:mod:`.commands.fake_engine`) and
  ``luftpause loadgen`` (:mod:`.commands.loadgen`); ``luftpause fake-mcp`` is the fake's own
  module (:mod:`.fakes.fake_mcp`).
"""
