"""Micro-benchmark of the admission transport: an admission on the open ``Connect`` stream.

Run: ``.venv/bin/pytest bench/test_bench_admission.py --benchmark-only
--benchmark-columns=median,iqr,ops,rounds``.

The scheduler side runs in a child process (``python bench/test_bench_admission.py serve PORT``):
the real :class:`SchedulerService` over a real :class:`SchedulerHost` (one replica of 1,000 slots,
so every admission is placed at once) and, on the same ``grpc.aio`` server, a plain unary echo of
a few bytes, the baseline. The dataplane side is the real :class:`SchedulerLink` in this process.

* ``stream, 1`` -- one round: ``await link.admit(...)`` answered placed, then the turn is reported
  finished (fire and forget, so the slot frees before the next round's admission is read).
* ``stream, 16 at once`` -- one round: 16 admissions awaited together, then 16 finishes.
* ``unary echo, 1`` / ``16 at once`` -- the same shapes as ``grpc.aio`` unary calls that do nothing.

Both sides share a 2-core machine with everything else, so read the ratios within one run.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.runs import RunTable
from luftpause.testkit.launch.procs import free_port
from luftpause.v1 import scheduler_pb2 as pb

ECHO_METHOD = "/luftpause.bench.Echo/Echo"
CONFIG = '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\nmax_inflight = 1000\n'
READY_S = 30.0  # a fail-safe for the child to listen, never a measured bound


async def _serve(port: int) -> None:
    from luftpause.config import parse_config
    from luftpause.scheduler.grpc_service import SchedulerService
    from luftpause.scheduler.host import SchedulerHost
    from luftpause.scheduler.server import GRPC_SERVER_OPTIONS
    from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    pb_grpc.add_SchedulerServicer_to_server(
        SchedulerService(SchedulerHost(parse_config(CONFIG, "bench"))), server
    )
    # no (de)serializers: bytes in, bytes out
    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("luftpause.bench.Echo", {"Echo": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


class Client:
    """The dataplane's side: a :class:`SchedulerLink` and an echo stub on one event loop."""

    def __init__(self, target: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.link = SchedulerLink(target, RunTable(), "dp-bench")
        self.target = target
        self.channel: grpc.aio.Channel | None = None
        self.echo: Any = None
        self.turns = itertools.count()

    def run(self, coro: Coroutine[Any, Any, None]) -> None:
        self.loop.run_until_complete(coro)

    async def start(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.target)  # bound to the running loop
        self.echo = self.channel.unary_unary(ECHO_METHOD)
        await self.link.start()
        async with asyncio.timeout(READY_S):
            while not self.link.connected:  # noqa: ASYNC110 - set by the link's stream reader
                await asyncio.sleep(0.01)

    async def admit(self) -> None:
        turn_id = f"t{next(self.turns)}"
        reply = await self.link.admit(pb.AdmitRequest(turn_id=turn_id, run_id=f"r{turn_id}", model="m"))
        assert reply.placed.replica == "a", reply
        self.link.report(pb.TurnEvent(turn_id=turn_id, run_id=f"r{turn_id}", kind=pb.TurnEvent.FINISHED))

    async def admit_many(self, count: int) -> None:
        await asyncio.gather(*(self.admit() for _ in range(count)))

    async def call_echo(self) -> None:
        assert await self.echo(b"turn-0123456789abcdef") == b"turn-0123456789abcdef"

    async def echo_many(self, count: int) -> None:
        await asyncio.gather(*(self.call_echo() for _ in range(count)))

    async def close(self) -> None:
        await self.link.close()
        if self.channel is not None:
            await self.channel.close()


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    port = free_port()
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", str(port)])
    try:
        running = Client(f"127.0.0.1:{port}")
        try:
            running.run(running.start())
            yield running
        finally:
            running.run(running.close())
            running.loop.close()
    finally:
        server.kill()
        server.wait()


def _rounds(client: Client, make: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    return lambda: client.run(make())


@pytest.mark.benchmark(group="admission round trip, 1")
def test_admission_on_the_open_stream(benchmark: Any, client: Client) -> None:
    benchmark.pedantic(_rounds(client, client.admit), rounds=2000, warmup_rounds=200)


@pytest.mark.benchmark(group="admission round trip, 1")
def test_unary_echo_baseline(benchmark: Any, client: Client) -> None:
    benchmark.pedantic(_rounds(client, client.call_echo), rounds=2000, warmup_rounds=200)


@pytest.mark.benchmark(group="admission round trip, 16 at once")
def test_sixteen_admissions_pipelined_on_the_open_stream(benchmark: Any, client: Client) -> None:
    benchmark.pedantic(_rounds(client, lambda: client.admit_many(16)), rounds=300, warmup_rounds=30)


@pytest.mark.benchmark(group="admission round trip, 16 at once")
def test_sixteen_unary_echoes_baseline(benchmark: Any, client: Client) -> None:
    benchmark.pedantic(_rounds(client, lambda: client.echo_many(16)), rounds=300, warmup_rounds=30)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    asyncio.run(_serve(int(sys.argv[2])))
