"""``luftpause fake-engine``: an OpenAI-compatible engine simulator standing in for SGLang/vLLM.

It speaks the chat completions wire format as vLLM and SGLang do (streamed and not, tool calls,
usage with cached tokens, logprobs) and vLLM's ``/classify``; schedules requests on a fixed number
of running slots with a waiting queue (FIFO or by priority); keeps a prefix cache per replica
(LRU, bounded in tokens); takes prefill and decode time from a cost model where decode slows as
the batch grows, all scaled by ``--time-scale``; and reports its load on ``/metrics`` under
SGLang's or vLLM's names. Every answer says it is simulated (``x-luftpause-simulated: 1``,
``"system_fingerprint": "luftpause-simulator"``). The pieces live in
:mod:`luftpause.testkit.engine`.

With ``--profile NAME`` it runs the step model instead (:mod:`luftpause.testkit.engine.stepped`):
one KV pool shared by running requests and the prefix cache, engine steps shared by every running
request, and SGLang's, vLLM's or llama.cpp's admission, retraction and preemption
(:mod:`luftpause.testkit.engine.model`); ``--pool-tokens``, ``--step-tokens`` and
``--max-running`` resize the profile, and ``--schedule-policy lpm`` orders the waiting queue by
longest cached prefix as SGLang's ``--schedule-policy lpm`` does.

With ``--apis chat,messages,responses`` it also serves ``POST /v1/messages`` (Anthropic Messages)
and ``POST /v1/responses`` (OpenAI Responses) natively, as vLLM and llama.cpp's server do
(:mod:`luftpause.testkit.engine.dialects`).

It misbehaves on demand (:mod:`luftpause.testkit.engine.faults`): per request through the body's
``"luftpause_fault"`` field, for every request for a model with ``--model-fault MODEL=SPEC``, or
for a random fraction of requests with ``--fault SPEC --fault-rate F --seed N``.

In tests::

    engine = await start_engine(EngineSettings(slots=1))
    try:
        client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x")
        ...
    finally:
        await engine.close()
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import uvloop

from luftpause.observe import logs
from luftpause.serving.ports import port_number
from luftpause.testkit.engine import EngineSettings, EngineStats, RunningEngine, SimulatedEngine, start_engine
from luftpause.testkit.engine.faults import KINDS, Fault, parse_fault_option
from luftpause.testkit.engine.model.profiles import PROFILES
from luftpause.testkit.engine.settings import (
    API_NAMES,
    DEFAULT_MODEL,
    METRIC_NAMINGS,
    PRIORITY_ORDERS,
    SCHEDULE_POLICIES,
)

__all__ = [
    "EngineSettings",
    "EngineStats",
    "RunningEngine",
    "SimulatedEngine",
    "add_arguments",
    "run",
    "settings_from_args",
    "start_engine",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``fake-engine`` flags (defaults as :class:`EngineSettings`)."""
    defaults = EngineSettings()
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port", type=port_number, default=30001, help="port to listen on, 1-65535 (default: %(default)s)"
    )
    parser.add_argument(
        "--model",
        type=_model_name,
        action="append",
        default=None,
        metavar="NAME",
        help=f"a model to serve; repeat for several (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--slots", type=int, default=defaults.slots, help="requests running at once (default: %(default)s)"
    )
    parser.add_argument(
        "--prefill-ms-per-1k",
        type=float,
        default=defaults.prefill_ms_per_1k,
        metavar="MS",
        help="prefill milliseconds per 1,000 prompt tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--decode-ms",
        type=float,
        default=defaults.decode_ms,
        metavar="MS",
        help="milliseconds per output token (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-slowdown",
        type=float,
        default=defaults.batch_slowdown,
        metavar="F",
        help="per-token decode time added by each other running request, as a fraction of --decode-ms "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--cache-tokens",
        type=int,
        default=None,
        metavar="N",
        help="prefix cache bound in tokens, LRU beyond it; 0 for none (default: the KV pool, slots x 8192)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=defaults.time_scale,
        metavar="F",
        help="multiply every simulated duration by F: 0.1 runs 10x faster (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics",
        choices=METRIC_NAMINGS,
        default=defaults.metrics,
        help="Prometheus names on /metrics (default: %(default)s)",
    )
    parser.add_argument(
        "--priority",
        choices=PRIORITY_ORDERS,
        default=defaults.priority_order,
        help="waiting-queue order by the request's priority field: fcfs ignores it, lower_first as vLLM, "
        "higher_first as SGLang (default: %(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        metavar="N",
        help="reply length when the request sets no max_tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--tool-rounds",
        type=int,
        default=defaults.tool_rounds,
        metavar="N",
        help="tool rounds before a final answer (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="varies text, tool choice and which requests get --fault (default: %(default)s)",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=None,
        metavar="NAME",
        help="a class of the simulated classifier behind POST /classify; repeat, at least 2 "
        f"(default: {', '.join(defaults.labels)})",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="run the step model of this engine profile instead of the slot model: one KV pool "
        "shared by running requests and the prefix cache, engine steps shared by all running requests, "
        "SGLang's, vLLM's or llama.cpp's scheduling (--slots, --prefill-ms-per-1k, --decode-ms, "
        "--batch-slowdown and --cache-tokens then do not apply; default: the slot model)",
    )
    parser.add_argument(
        "--pool-tokens",
        type=int,
        default=None,
        metavar="N",
        help="with --profile: the KV pool's size in tokens (default: the profile's)",
    )
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=None,
        metavar="N",
        help="with --profile: tokens one engine step may compute, SGLang's chunked_prefill_size or "
        "vLLM's max_num_batched_tokens (default: the profile's)",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        default=None,
        metavar="N",
        help="with --profile: requests running at once at most (default: the profile's)",
    )
    parser.add_argument(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default=defaults.schedule_policy,
        help="with an sglang or vllm --profile: the waiting queue's order before each step, arrival "
        "(fcfs) or SGLang's longest cached prefix first (lpm) (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-close-ms",
        type=float,
        default=None,
        metavar="MS",
        help="drop a POST that arrives on a kept-alive connection idle for MS or more: the connection is "
        "reset, nothing answered, as when an engine's idle close (uvicorn's, llama-server's: 5000) "
        "crosses a request (default: never)",
    )
    parser.add_argument(
        "--fault",
        default=None,
        metavar="SPEC",
        help=f"a fault for requests that ask for none: a kind ({', '.join(KINDS)}) "
        'or the JSON of the request field, e.g. \'{"kind": "status", "status": 429, "retry_after": 1}\'',
    )
    parser.add_argument(
        "--model-fault",
        action="append",
        default=None,
        metavar="MODEL=SPEC",
        help="every request for MODEL (also served) gets the fault SPEC (as --fault) unless it asks "
        "for its own; repeat for several models",
    )
    parser.add_argument(
        "--apis",
        type=_apis,
        default=("chat",),
        metavar="API,...",
        help="the APIs served: chat, plus messages (POST /v1/messages) and responses "
        "(POST /v1/responses) natively (default: chat)",
    )
    parser.add_argument(
        "--fault-rate",
        type=float,
        default=None,
        metavar="F",
        help="the fraction of requests (0 to 1) that get --fault, drawn from --seed (default: 1)",
    )


def _model_name(text: str) -> str:
    """An ``argparse`` type: a model name, not empty nor blank (a request could never name it)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a model name must not be empty")
    return text


def _apis(text: str) -> tuple[str, ...]:
    """An ``argparse`` type: a comma-separated list of API names, ``chat`` added when absent."""
    names = tuple(dict.fromkeys(["chat", *(name.strip() for name in text.split(",") if name.strip())]))
    unknown = [name for name in names if name not in API_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown API {unknown[0]!r}: expected {', '.join(API_NAMES)}")
    return names


def _model_faults(values: list[str] | None) -> tuple[tuple[str, Fault], ...]:
    pairs = []
    for value in values or ():
        model, sep, spec = value.partition("=")
        if not sep or not model.strip():
            raise ValueError(f"--model-fault expects MODEL=SPEC, got {value!r}")
        pairs.append((model, parse_fault_option(spec)))
    return tuple(pairs)


def settings_from_args(args: argparse.Namespace) -> EngineSettings:
    """:class:`EngineSettings` from parsed ``fake-engine`` flags; raises ``ValueError`` on bad values
    (a bad ``--fault`` spec, or ``--fault-rate`` without ``--fault``)."""
    fault = parse_fault_option(args.fault) if args.fault is not None else None
    if args.fault_rate is not None and fault is None:
        raise ValueError("--fault-rate needs --fault")
    model_faults = _model_faults(args.model_fault)
    models = tuple(args.model or (() if model_faults else (DEFAULT_MODEL,)))
    models += tuple(model for model, _ in model_faults if model not in models)
    return EngineSettings(
        models=models,
        apis=args.apis,
        model_faults=model_faults,
        slots=args.slots,
        prefill_ms_per_1k=args.prefill_ms_per_1k,
        decode_ms=args.decode_ms,
        batch_slowdown=args.batch_slowdown,
        cache_tokens=args.cache_tokens,
        time_scale=args.time_scale,
        metrics=args.metrics,
        priority_order=args.priority,
        max_tokens=args.max_tokens,
        tool_rounds=args.tool_rounds,
        seed=args.seed,
        fault=fault,
        fault_rate=1.0 if args.fault_rate is None else args.fault_rate,
        labels=tuple(args.label) if args.label else EngineSettings().labels,
        profile=args.profile,
        pool_tokens=args.pool_tokens,
        step_tokens=args.step_tokens,
        max_running=args.max_running,
        idle_close_ms=args.idle_close_ms,
        schedule_policy=args.schedule_policy,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 on a clean stop, 2 on bad flags or a port in use."""
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        logs.announce("fake-engine", f"luftpause fake-engine: {exc}", level=logging.ERROR)
        return 2
    # uvloop, as the dataplane uses: the simulator shares two cores with what it measures.
    return uvloop.run(_serve(settings, args.host, args.port))


def _not_an_http2_probe(record: logging.LogRecord) -> bool:
    """False for aiohttp's error about an HTTP/2 connection preface (``PRI * HTTP/2.0``).

    SGLang's router opens one to each worker to find out whether it speaks gRPC, then falls back
    to HTTP/1.1; the refusal is the expected answer, not an error worth a traceback in the log.
    """
    error = record.exc_info[1] if record.exc_info else None
    return not (error is not None and "PRI/Upgrade" in str(error))


async def _serve(settings: EngineSettings, host: str, port: int) -> int:
    logging.getLogger("aiohttp.server").addFilter(_not_an_http2_probe)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        engine = await start_engine(settings, host, port)
    except OSError as exc:
        logs.announce(
            "fake-engine",
            f"luftpause fake-engine: cannot listen on {host}:{port}: {exc}",
            level=logging.ERROR,
        )
        return 2
    try:
        logs.announce(
            "fake-engine", f"luftpause fake-engine: serving {', '.join(settings.models)} on {engine.url}"
        )
        await stop.wait()
    finally:
        await engine.close()
    return 0
